package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/internal/metricdoc"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

const gib = int64(1) << 30

// fakeCard is one GPU behind go-nvml's mock: its processes and what they
// hold, the driver's reservation, and an error to answer with.
type fakeCard struct {
	mu     sync.Mutex
	total  int64
	driver int64
	procs  map[uint32]int64 // pid → bytes
	names  map[uint32]string
	fail   nvml.Return // answered by GetMemoryInfo when not SUCCESS
}

func newFakeCard(total int64) *fakeCard {
	return &fakeCard{total: total, driver: gib / 2, procs: map[uint32]int64{}, names: map[uint32]string{}}
}

func (c *fakeCard) set(pid int, name string, used int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if used == 0 {
		delete(c.procs, uint32(pid))
		return
	}
	c.procs[uint32(pid)], c.names[uint32(pid)] = used, name
}

func (c *fakeCard) lib(initRet nvml.Return) *mock.Interface {
	dev := &mock.Device{
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.fail != nvml.SUCCESS {
				return nvml.Memory{}, c.fail
			}
			used := c.driver
			for _, u := range c.procs {
				used += u
			}
			return nvml.Memory{Total: uint64(c.total), Used: uint64(used), Free: uint64(c.total - used)}, nvml.SUCCESS
		},
		GetNameFunc: func() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3", nvml.SUCCESS },
		GetUUIDFunc: func() (string, nvml.Return) { return "GPU-0000-test", nvml.SUCCESS },
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			c.mu.Lock()
			defer c.mu.Unlock()
			var out []nvml.ProcessInfo
			for pid, u := range c.procs {
				out = append(out, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: uint64(u)})
			}
			return out, nvml.SUCCESS
		},
		GetGraphicsRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS },
	}
	return &mock.Interface{
		InitFunc:           func() nvml.Return { return initRet },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		ErrorStringFunc:    func(r nvml.Return) string { return fmt.Sprintf("nvml error %d", int32(r)) },
		DeviceGetCountFunc: func() (int, nvml.Return) { return 1, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i != 0 {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return dev, nvml.SUCCESS
		},
		SystemGetProcessNameFunc: func(pid int) (string, nvml.Return) {
			c.mu.Lock()
			defer c.mu.Unlock()
			if n, ok := c.names[uint32(pid)]; ok {
				return n, nvml.SUCCESS
			}
			return "", nvml.ERROR_NOT_FOUND
		},
	}
}

// gpuWatchConfig is the base config with a watch that the test polls.
func gpuWatchConfig(url, watch string) string {
	return baseConfig(url+" 80GiB", "gpu_watch: {"+watch+"}\n")
}

// watchStatus is /status's view of gpu0 and the watch.
func watchStatus(t *testing.T, gwURL string) (gpuView, gpuWatchView) {
	t.Helper()
	resp, err := http.Get(gwURL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		GPUs     []gpuView    `json:"gpus"`
		GPUWatch gpuWatchView `json:"gpu_watch"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if len(v.GPUs) != 1 {
		t.Fatalf("status has %d GPUs", len(v.GPUs))
	}
	return v.GPUs[0], v.GPUWatch
}

func gpuMetric(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	for _, m := range fams[name].GetMetric() {
		match := true
		for k, v := range labels {
			found := false
			for _, l := range m.GetLabel() {
				found = found || l.GetName() == k && l.GetValue() == v
			}
			match = match && found
		}
		if match {
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// A foreign process appearing, growing past the floor and leaving moves the
// floor check, the budget, the metrics, the warnings and /status; the
// backend's own process (the one listening on its port: here this test
// process, which serves the simulator) is told apart from it.
func TestGPUWatchForeignProcess(t *testing.T) {
	_, simURL := startSim(t, nil)
	card := newFakeCard(80 * gib)
	self := os.Getpid()
	card.set(self, "vllm", 70*gib)
	var logs syncbuf.Buffer
	s, gwURL := startGateway(t, gpuWatchConfig(simURL, "source: nvml, free_floor: 4GiB"),
		Options{DisableProbes: true, NVML: card.lib(nvml.SUCCESS), Clock: newClock(),
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	nominal := s.rt.Load().gpus["gpu0"].nominal

	type step struct {
		what      string
		foreign   int64 // bytes the foreign process holds
		wantCut   int64
		wantEvent map[string]float64
		wantLog   string
	}
	for _, st := range []step{
		{"only the backend", 0, 0, map[string]float64{"contention": 0, "below_floor": 0}, ""},
		{"a training job appears", 2 * gib, 0, map[string]float64{"contention": 1, "below_floor": 0}, "python3 (pid 4242, other): 2.0 GiB"},
		// 80 − 0.5 − 70 − 8 = 1.5 GiB free: 2.5 GiB under the floor.
		{"it grows past the floor", 8 * gib, 4*gib - 3*gib/2, map[string]float64{"contention": 1, "below_floor": 1}, "the budget is cut by 2.5 GiB"},
		{"it leaves", 0, 0, map[string]float64{"contention": 1, "below_floor": 1}, "a process other than the backends left the GPU"},
	} {
		card.set(4242, "python3", st.foreign)
		s.pollGPUs(ctx)
		if got := gpuStats(s, "gpu0").Capacity; got != nominal-st.wantCut {
			t.Errorf("%s: capacity %d, want %d (nominal %d − cut %d)", st.what, got, nominal-st.wantCut, nominal, st.wantCut)
		}
		gv, wv := watchStatus(t, gwURL)
		if wv.Source != "nvml" || gv.Memory == nil {
			t.Fatalf("%s: /status gpu_watch %+v, gpu memory %+v", st.what, wv, gv.Memory)
		}
		if gv.Memory.BelowFloor != (st.wantCut > 0) || gv.Memory.Other != st.foreign {
			t.Errorf("%s: /status memory %+v", st.what, gv.Memory)
		}
		if st.wantCut > 0 {
			if len(gv.Cuts) != 1 || gv.Cuts[0].Cause != "gpu_free_below_floor" || gv.Cuts[0].Bytes != st.wantCut {
				t.Errorf("%s: budget_cuts %+v, want gpu_free_below_floor of %d", st.what, gv.Cuts, st.wantCut)
			}
		} else if len(gv.Cuts) != 0 {
			t.Errorf("%s: budget_cuts %+v, want none", st.what, gv.Cuts)
		}
		var own, other int
		for _, p := range gv.Memory.Processes {
			switch {
			case p.PID == self && p.Own:
				own++
			case p.PID == 4242 && !p.Own && p.Name == "python3":
				other++
			default:
				t.Errorf("%s: process %+v told apart wrongly", st.what, p)
			}
		}
		if own != 1 || (other == 1) != (st.foreign > 0) {
			t.Errorf("%s: processes %+v", st.what, gv.Memory.Processes)
		}
		fams := scrapeGateway(t, gwURL)
		for ev, want := range st.wantEvent {
			if got, _ := gpuMetric(fams, "kvgate_gpu_memory_events_total", map[string]string{"gpu": "gpu0", "event": ev}); got != want {
				t.Errorf("%s: events_total{event=%s} = %v, want %v", st.what, ev, got, want)
			}
		}
		if got, _ := gpuMetric(fams, "kvgate_gpu_memory_budget_cut_bytes", map[string]string{"gpu": "gpu0"}); got != float64(st.wantCut) {
			t.Errorf("%s: budget_cut_bytes %v, want %d", st.what, got, st.wantCut)
		}
		got, ok := gpuMetric(fams, "kvgate_gpu_process_memory_bytes", map[string]string{"gpu": "gpu0", "pid": "4242", "owner": "other"})
		if ok != (st.foreign > 0) || got != float64(st.foreign) {
			t.Errorf("%s: process series for pid 4242: %v (present %v), want %d", st.what, got, ok, st.foreign)
		}
		if _, ok := gpuMetric(fams, "kvgate_gpu_process_memory_bytes", map[string]string{"pid": fmt.Sprint(self), "owner": "backend"}); !ok {
			t.Errorf("%s: no series for the backend's own process", st.what)
		}
		if st.wantLog != "" && !strings.Contains(logs.String(), st.wantLog) {
			t.Errorf("%s: no log with %q:\n%s", st.what, st.wantLog, logs.String())
		}
	}
	// The alert a snapshot went with is on /status.
	gv, _ := watchStatus(t, gwURL)
	if a := gv.Memory.LastAlert; a == nil || a.Event != gpuEventBelowFloor || len(a.Processes) != 2 {
		t.Errorf("last alert %+v, want below_floor with both processes", a)
	}
}

// A backend that comes back with a smaller pool (a restart beside residue)
// is logged with the process holding the difference, and shows on
// /status; an out-of-memory answer logs a snapshot too.
func TestGPUWatchSmallerPoolNamesTheHolder(t *testing.T) {
	var blocks atomic.Int64
	blocks.Store(20000)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprintf(w, "vllm:kv_cache_usage_perc{model_name=\"llama-3-8b\"} 0\n"+
				"vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"%d\"} 1\n", blocks.Load())
		}
	}))
	t.Cleanup(be.Close)
	card := newFakeCard(80 * gib)
	card.set(os.Getpid(), "vllm", 60*gib)
	var logs syncbuf.Buffer
	s, gwURL := startGateway(t, gpuWatchConfig(be.URL, "source: nvml, interval: 1h"),
		Options{NVML: card.lib(nvml.SUCCESS), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	rt := s.rt.Load()
	g := rt.gpus["gpu0"]
	poolOf := func(n int64) int64 { return n * 16 * g.bytesPerToken[g.backends[0]] }
	eventually(t, "the first pool report", func() bool { p, _, ok := g.reported(); return ok && p == poolOf(20000) })

	// The backend restarts; a zombie holds 6 GiB, and the pool comes back smaller.
	card.set(777, "zombie.py", 6*gib)
	blocks.Store(15000)
	eventually(t, "the smaller pool's warning", func() bool { return strings.Contains(logs.String(), "pool_shrunk") }, logs.String)
	if !strings.Contains(logs.String(), "zombie.py (pid 777, other): 6.0 GiB") {
		t.Errorf("the warning does not name the holder:\n%s", logs.String())
	}
	gv, _ := watchStatus(t, gwURL)
	if gv.Memory == nil || gv.Memory.LastAlert == nil || gv.Memory.LastAlert.Event != gpuEventPoolShrunk ||
		!strings.Contains(gv.Memory.LastAlert.Message, "zombie.py") || gv.Memory.Events[gpuEventPoolShrunk] != 1 {
		t.Errorf("/status memory %+v", gv.Memory)
	}

	s.gpuOutOfMemory(rt, "gpu0")
	s.gpuOutOfMemory(rt, "gpu0") // within the interval: counted, not logged again
	if n := strings.Count(logs.String(), "event=oom"); n != 1 {
		t.Errorf("%d oom snapshots logged, want 1:\n%s", n, logs.String())
	}
	gv, _ = watchStatus(t, gwURL)
	if gv.Memory.Events[gpuEventOOM] != 2 || gv.Memory.LastAlert.Event != gpuEventOOM {
		t.Errorf("/status after two out-of-memory answers: %+v", gv.Memory)
	}
}

// A missing driver leaves everything as it was, said once; an NVML that
// fails otherwise too, with a warning; a reading that fails later drops the
// cut and says why.
func TestGPUWatchFallsBackCleanly(t *testing.T) {
	_, simURL := startSim(t, nil)
	for _, tc := range []struct {
		name    string
		source  string
		init    nvml.Return
		wantLog string
	}{
		{"no driver", "auto", nvml.ERROR_LIBRARY_NOT_FOUND, "level=INFO msg=\"gpu_watch: no GPU memory source"},
		{"driver not loaded, nvml asked for", "nvml", nvml.ERROR_DRIVER_NOT_LOADED, "level=WARN msg=\"gpu_watch: NVML failed"},
		{"nvml broken", "auto", nvml.ERROR_UNKNOWN, "level=WARN msg=\"gpu_watch: NVML failed"},
		{"switched off", "off", nvml.SUCCESS, "gpu_watch.source is off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncbuf.Buffer
			card := newFakeCard(80 * gib)
			s, gwURL := startGateway(t, gpuWatchConfig(simURL, "source: "+tc.source),
				Options{DisableProbes: true, NVML: card.lib(tc.init), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			s.pollGPUs(context.Background())
			if !strings.Contains(logs.String(), tc.wantLog) || strings.Count(logs.String(), "msg=\"gpu_watch") != 1 {
				t.Errorf("logs want %q once:\n%s", tc.wantLog, logs.String())
			}
			gv, wv := watchStatus(t, gwURL)
			if gv.Memory != nil || wv.Off == "" || gv.Capacity != s.rt.Load().gpus["gpu0"].nominal {
				t.Errorf("/status %+v %+v: want no memory, the reason off, the configured budget", gv, wv)
			}
			for name := range scrapeGateway(t, gwURL) {
				if strings.HasPrefix(name, "kvgate_gpu_") {
					t.Errorf("%s exported without a GPU memory source", name)
				}
			}
		})
	}

	t.Run("reading fails later", func(t *testing.T) {
		card := newFakeCard(80 * gib)
		card.set(4242, "python3", 78*gib) // 1.5 GiB free: 0.5 GiB under a 2 GiB floor
		s, gwURL := startGateway(t, gpuWatchConfig(simURL, "source: nvml, free_floor: 2GiB"),
			Options{DisableProbes: true, NVML: card.lib(nvml.SUCCESS)})
		nominal := s.rt.Load().gpus["gpu0"].nominal
		s.pollGPUs(context.Background())
		if got := gpuStats(s, "gpu0").Capacity; got != nominal-gib/2 {
			t.Fatalf("capacity %d, want nominal − 0.5 GiB", got)
		}
		card.mu.Lock()
		card.fail = nvml.ERROR_GPU_IS_LOST
		card.mu.Unlock()
		s.pollGPUs(context.Background())
		if got := gpuStats(s, "gpu0").Capacity; got != nominal {
			t.Errorf("after a failed reading: capacity %d, want the configured %d", got, nominal)
		}
		gv, wv := watchStatus(t, gwURL)
		if wv.Error == "" || gv.Memory != nil || len(gv.Cuts) != 0 {
			t.Errorf("/status after a failed reading: %+v %+v", wv, gv)
		}
		if got, _ := gpuMetric(scrapeGateway(t, gwURL), "kvgate_gpu_watch_errors_total", nil); got != 1 {
			t.Errorf("kvgate_gpu_watch_errors_total = %v, want 1", got)
		}
	})
}

// A DCGM exporter's /metrics, served by the test: device totals, no
// processes; the floor cuts the budget as with NVML.
func TestGPUWatchDCGMExporter(t *testing.T) {
	_, simURL := startSim(t, nil)
	var usedMiB atomic.Int64
	usedMiB.Store(70 * 1024)
	exp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		u := usedMiB.Load()
		for _, f := range []struct {
			name string
			mib  int64
		}{{"DCGM_FI_DEV_FB_FREE", 81559 - u}, {"DCGM_FI_DEV_FB_USED", u}} {
			fmt.Fprintf(w, "# HELP %s Framebuffer memory (in MiB).\n# TYPE %s gauge\n", f.name, f.name)
			for _, gpu := range []string{"0", "1"} {
				fmt.Fprintf(w, "%s{gpu=%q,UUID=\"GPU-%s\",device=\"nvidia%s\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node1\"} %d\n",
					f.name, gpu, gpu, gpu, f.mib)
			}
		}
	}))
	t.Cleanup(exp.Close)
	cfg := strings.Replace(gpuWatchConfig(simURL, "source: '"+exp.URL+"/metrics', free_floor: 8GiB"), "    models:", "    gpu_device: GPU-1\n    models:", 1)
	s, gwURL := startGateway(t, cfg, Options{DisableProbes: true})
	nominal := s.rt.Load().gpus["gpu0"].nominal
	for _, tc := range []struct {
		used    int64 // MiB
		wantCut int64
	}{
		{70 * 1024, 0},                           // 9.6 GiB free
		{75 * 1024, 8*gib - (81559-75*1024)<<20}, // 4.6 GiB free
		{60 * 1024, 0},
	} {
		usedMiB.Store(tc.used)
		s.pollGPUs(context.Background())
		gv, wv := watchStatus(t, gwURL)
		if wv.Error != "" || gv.Memory == nil {
			t.Fatalf("/status %+v %+v", wv, gv)
		}
		if gv.Memory.Device != "1 GPU-1" || gv.Memory.Used != tc.used<<20 || gv.Memory.Total != 81559<<20 || gv.Memory.Processes != nil {
			t.Errorf("used %d MiB: memory %+v", tc.used, gv.Memory)
		}
		if got := gpuStats(s, "gpu0").Capacity; got != nominal-tc.wantCut {
			t.Errorf("used %d MiB: capacity %d, want %d", tc.used, got, nominal-tc.wantCut)
		}
	}
}

// The GPU memory watch's series are the ones docs/METRICS.md lists for it,
// and follow the naming rules.
func TestGPUWatchMetricsMatchDocs(t *testing.T) {
	_, simURL := startSim(t, nil)
	card := newFakeCard(80 * gib)
	card.set(os.Getpid(), "vllm", 70*gib)
	card.set(4242, "python3", 2*gib)
	s, gwURL := startGateway(t, gpuWatchConfig(simURL, "source: nvml"), Options{DisableProbes: true, NVML: card.lib(nvml.SUCCESS)})
	// Before the first reading, the event counters are there at zero, so
	// that increase() sees the first event.
	for _, e := range gpuEvents {
		if v, ok := gpuMetric(scrapeGateway(t, gwURL), "kvgate_gpu_memory_events_total", map[string]string{"gpu": "gpu0", "event": e}); !ok || v != 0 {
			t.Errorf("before the first reading: events_total{event=%s} = %v (present %v), want 0", e, v, ok)
		}
	}
	s.pollGPUs(context.Background())
	rows, err := metricdoc.ParseFile("../docs/METRICS.md", "gpu_watch")
	if err != nil {
		t.Fatal(err)
	}
	fams := scrapeGateway(t, gwURL)
	for _, d := range metricdoc.Compare(rows, fams, func(name string) bool { return !strings.HasPrefix(name, "kvgate_gpu_") }) {
		t.Error(d)
	}
	own := map[string]*dto.MetricFamily{}
	for name, f := range fams {
		if strings.HasPrefix(name, "kvgate_gpu_") {
			own[name] = f
		}
	}
	for _, p := range metricdoc.Lint(own, nil) {
		t.Error(p)
	}
}

// gpu_watch's fields are checked by name.
func TestGPUWatchConfigErrors(t *testing.T) {
	for _, tc := range []struct{ extra, want string }{
		{"gpu_watch: {source: nvm}", "gpu_watch.source: \"nvm\" is not auto, nvml, off or an http(s) URL"},
		{"gpu_watch: {source: 'ftp://x'}", "gpu_watch.source"},
		{"gpu_watch: {interval: 0s}", "gpu_watch.interval: must be > 0"},
		{"gpu_watch: {free_floor: lots}", "gpu_watch.free_floor"},
		{"gpu_watch: {residue_min: -1GiB}", "gpu_watch.residue_min"},
	} {
		_, err := Parse([]byte(baseConfig("http://127.0.0.1:1", tc.extra+"\n")), ".")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.extra, err, tc.want)
		}
	}
	two := fleetConfig("", "http://127.0.0.1:1", "http://127.0.0.1:2")
	two = strings.Replace(two, "name: gpu1\n", "name: gpu1\n    gpu: gpu0\n    gpu_device: '1'\n", 1)
	two = strings.Replace(two, "name: gpu0\n", "name: gpu0\n    gpu_device: '0'\n", 1)
	if _, err := Parse([]byte(two), "."); err == nil || !strings.Contains(err.Error(), "backends[1].gpu_device") {
		t.Errorf("two devices for one GPU: %v", err)
	}
	cfg, err := Parse([]byte(baseConfig("http://127.0.0.1:1", "")), ".")
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.GPUWatch
	if w.Source != "auto" || w.Interval.D != defaultGPUInterval || w.FreeFloor.Bytes != gib || w.ResidueMin.Bytes != gib {
		t.Errorf("defaults %+v", w)
	}
}

// A reload keeps the running source (it needs a restart, and says so) and
// the cut in force: the budget it rebuilds from the config is cut again at
// the next reading, under the reloaded floor.
func TestGPUWatchAcrossReload(t *testing.T) {
	_, simURL := startSim(t, nil)
	card := newFakeCard(80 * gib)
	card.set(4242, "python3", 78*gib) // 1.5 GiB free
	var logs syncbuf.Buffer
	s, _ := startGateway(t, gpuWatchConfig(simURL, "source: nvml, free_floor: 2GiB"),
		Options{DisableProbes: true, NVML: card.lib(nvml.SUCCESS), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	nominal := s.rt.Load().gpus["gpu0"].nominal
	s.pollGPUs(context.Background())
	if got := gpuStats(s, "gpu0").Capacity; got != nominal-gib/2 {
		t.Fatalf("capacity %d, want nominal − 0.5 GiB", got)
	}
	cfg, err := Parse([]byte(gpuWatchConfig(simURL, "source: off, free_floor: 3GiB")), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "gpu_watch.source changes need a restart") {
		t.Errorf("no warning about the source:\n%s", logs.String())
	}
	s.pollGPUs(context.Background())
	if got := gpuStats(s, "gpu0").Capacity; got != nominal-3*gib/2 {
		t.Errorf("after the reload: capacity %d, want nominal − 1.5 GiB (the reloaded floor, the running source)", got)
	}
}
