package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kvgate/kvgate/backends/gpuinfo"
	"github.com/kvgate/kvgate/kvbudget"
)

// The GPU memory watch: what else is on a backend's GPU. A backend's KV
// reports say what its own pool holds; they cannot say that a training job,
// a second server or the residue of a crashed process took the memory its
// activations need, and nothing shows until it fails. The watch reads every
// GPU's memory and the processes holding it (NVML on this host, or the
// GPU node's exporter), every gpu_watch.interval on the gateway's clock,
// and:
//
//   - cuts the GPU's budget by what its free memory lacks of
//     gpu_watch.free_floor, for as long as it lacks it (memoryCut: one named
//     input of the budget, beside the reported pool);
//   - tells the backends' own processes (those behind their URL's port)
//     from the others, and warns, with a snapshot of who holds how much,
//     when another process appears, when residue appears, when the floor is
//     crossed, when a backend comes back with a smaller pool and when one
//     runs out of memory;
//   - exports the same figures as metrics and on /status.
//
// Without a source (no NVML, gpu_watch.source: off) nothing changes: the
// fallback is said once at start. A failed reading drops the cut (the
// budget is what it would be without the watch) and says why on /status.

// gpuSource reads the devices of the node the backends run on.
type gpuSource interface {
	Devices(ctx context.Context) ([]gpuinfo.Device, error)
}

// nvmlSource is NVML on this host.
type nvmlSource struct{ n *gpuinfo.NVML }

func (s nvmlSource) Devices(context.Context) ([]gpuinfo.Device, error) { return s.n.Devices() }

// The events a watched GPU warns of, each counted
// (kvgate_gpu_memory_events_total) and kept as the GPU's last alert.
const (
	gpuEventContention = "contention"  // a process other than the backends' took memory
	gpuEventBelowFloor = "below_floor" // free memory fell under the floor: the budget is cut
	gpuEventResidue    = "residue"     // used memory no process accounts for
	gpuEventPoolShrunk = "pool_shrunk" // a backend came back with a smaller KV pool
	gpuEventOOM        = "oom"         // a backend answered out of memory
)

var gpuEvents = []string{gpuEventContention, gpuEventBelowFloor, gpuEventResidue, gpuEventPoolShrunk, gpuEventOOM}

// gpuWatch is the watch's state. src and what describes it are set once at
// start; the rest is guarded by mu.
type gpuWatch struct {
	src    gpuSource // nil: nothing is watched
	source string    // "nvml" or the URL, for /status and logs
	off    string    // why nothing is watched, when src is nil
	close  func()
	closed sync.Once
	log    *slog.Logger
	now    func() time.Time

	mu      sync.Mutex
	gpus    map[string]*gpuMemState // by GPU name
	readAt  time.Time
	readErr string // the last reading's error; "" when it succeeded
	errors  int64
	pools   map[string]int64 // backend name → the KV pool it last reported, bytes
}

// gpuMemState is one GPU as the watch last saw it.
type gpuMemState struct {
	dev    *gpuinfo.Device // nil: no device of the source matched
	procs  []gpuProcess
	other  int64 // Σ of the other processes' memory
	unattr int64 // used memory no listed process holds (residue and the driver's part)
	floor  int64
	below  bool
	cut    int64
	resid  bool
	// foreign are the other processes' pids at the last reading.
	foreign map[int]bool
	events  map[string]int64
	last    *gpuAlert
	oomAt   time.Time // when an out-of-memory snapshot was last logged
}

// gpuProcess is a process on a GPU, told apart as the backends' own or not.
type gpuProcess struct {
	PID  int    `json:"pid"`
	Name string `json:"name"`
	Used int64  `json:"used_bytes"` // -1: the driver did not say
	Own  bool   `json:"backend"`    // listens on (or descends from the listener of) a backend's port
}

// gpuAlert is one warning with the snapshot it carried.
type gpuAlert struct {
	Event     string       `json:"event"`
	At        string       `json:"at"`
	Message   string       `json:"message"`
	Free      int64        `json:"free_bytes"`
	Processes []gpuProcess `json:"processes"`
}

// newGPUWatch opens the configured source. Only NVML's absence (or a
// source set off) leaves the watch off without a warning: an NVML that
// fails otherwise is logged, and the gateway runs on without the watch.
func newGPUWatch(cfg GPUWatchConfig, lib nvml.Interface, log *slog.Logger, now func() time.Time) *gpuWatch {
	w := &gpuWatch{log: log, now: now, close: func() {}, gpus: map[string]*gpuMemState{}, pools: map[string]int64{}}
	switch cfg.Source {
	case gpuSourceOff:
		w.off = "gpu_watch.source is off"
	case gpuSourceAuto, gpuSourceNVML:
		if lib == nil {
			lib = nvml.New()
		}
		n, err := gpuinfo.OpenNVML(lib)
		if err != nil {
			w.off = err.Error()
			if !errors.Is(err, gpuinfo.ErrNoGPU) || cfg.Source == gpuSourceNVML {
				log.Warn("gpu_watch: NVML failed, GPU memory is not watched; budgets are as configured", "err", err)
				return w
			}
			break
		}
		w.src, w.source, w.close = nvmlSource{n}, gpuSourceNVML, n.Close
	default:
		w.src, w.source = gpuinfo.Remote{URL: cfg.Source, Client: &http.Client{Timeout: 5 * time.Second}}, cfg.Source
	}
	if w.src == nil {
		log.Info("gpu_watch: no GPU memory source, budgets are as configured", "why", w.off)
	} else {
		log.Info("gpu_watch: watching GPU memory", "source", w.source, "interval", cfg.Interval.D, "free_floor", cfg.FreeFloor.Bytes)
	}
	return w
}

// closeOnce releases the source (NVML's Shutdown).
func (w *gpuWatch) closeOnce() { w.closed.Do(w.close) }

// runGPUWatch polls every interval until ctx ends, on the gateway's clock.
func (s *Server) runGPUWatch(ctx context.Context) {
	for {
		s.pollGPUs(ctx)
		rt := s.rt.Load()
		tick := make(chan struct{})
		t := s.opt.Clock.AfterFunc(rt.cfg.GPUWatch.Interval.D, func() { close(tick) })
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-tick:
		}
	}
}

// pollGPUs reads the source once and brings every GPU's state, budget,
// metrics and warnings up to date with it.
func (s *Server) pollGPUs(ctx context.Context) {
	w := s.gpuWatch
	if w.src == nil {
		return
	}
	rt := s.rt.Load()
	devs, err := w.src.Devices(ctx)
	now := w.now()
	w.mu.Lock()
	w.readAt = now
	if err != nil {
		w.errors++
		first := w.readErr == ""
		w.readErr = err.Error()
		// The figures are unknown: the budget goes back to what it would
		// be without the watch, and says why on /status.
		var cut []*gpu
		for name, st := range w.gpus {
			if st.cut != 0 {
				if g := rt.gpus[name]; g != nil {
					cut = append(cut, g)
				}
			}
			st.dev, st.procs, st.below, st.cut, st.other, st.unattr = nil, nil, false, 0, 0, 0
		}
		w.mu.Unlock()
		if first {
			s.log.Warn("gpu_watch: reading GPU memory failed; budgets are as configured until it succeeds", "source", w.source, "err", err)
		}
		for _, g := range cut {
			s.applyBudget(rt, g)
		}
		return
	}
	if w.readErr != "" {
		s.log.Info("gpu_watch: reading GPU memory again", "source", w.source)
	}
	w.readErr = ""
	wc := rt.cfg.GPUWatch
	var changed []*gpu
	var logs []func()
	for _, name := range sortedGPUNames(rt) {
		g := rt.gpus[name]
		st := w.gpus[name]
		if st == nil {
			st = &gpuMemState{foreign: map[int]bool{}, events: map[string]int64{}}
			w.gpus[name] = st
		}
		dev := pickDevice(devs, rt.deviceOf(name))
		oldCut := st.cut
		if dev == nil {
			st.dev, st.procs, st.below, st.cut = nil, nil, false, 0
		} else {
			logs = append(logs, s.observeGPULocked(rt, g, st, dev, wc, now)...)
		}
		// A cut in force is applied again too: a reload rebuilds the
		// budget from its configured inputs.
		if st.cut != oldCut || st.cut != 0 {
			changed = append(changed, g)
		}
	}
	w.mu.Unlock()
	for _, l := range logs {
		l()
	}
	for _, g := range changed {
		s.applyBudget(rt, g)
	}
}

// observeGPULocked updates st from a reading of its device and returns the
// warnings to log once w.mu is released.
func (s *Server) observeGPULocked(rt *runtime, g *gpu, st *gpuMemState, dev *gpuinfo.Device, wc GPUWatchConfig, now time.Time) []func() {
	d := *dev
	st.dev = &d
	ports := rt.backendPorts(g)
	st.procs, st.other = st.procs[:0], 0
	listed := dev.Processes != nil
	var known int64
	foreign := map[int]bool{}
	var appeared, left []int
	for _, p := range dev.Processes {
		own := slices.ContainsFunc(p.Ports, func(port int) bool { return slices.Contains(ports, port) })
		st.procs = append(st.procs, gpuProcess{PID: p.PID, Name: p.Name, Used: p.Used, Own: own})
		if p.Used > 0 {
			known += p.Used
		}
		if !own {
			st.other += max(p.Used, 0)
			foreign[p.PID] = true
			if !st.foreign[p.PID] {
				appeared = append(appeared, p.PID)
			}
		}
	}
	for pid := range st.foreign {
		if !foreign[pid] {
			left = append(left, pid)
		}
	}
	st.foreign = foreign
	st.unattr = 0
	if listed {
		st.unattr = max(0, dev.Used-known)
	}
	st.floor = wc.FreeFloor.Bytes
	wasBelow, wasResid := st.below, st.resid
	st.below = st.floor > 0 && dev.Free < st.floor
	st.cut = 0
	if st.below {
		st.cut = st.floor - dev.Free
	}
	st.resid = listed && st.unattr >= wc.ResidueMin.Bytes
	var logs []func()
	if len(appeared) > 0 {
		slices.Sort(appeared)
		logs = append(logs, s.alertLocked(g.name, st, gpuEventContention, now,
			fmt.Sprintf("another process took memory on the GPU: pid %s", joinInts(appeared))))
	}
	if len(left) > 0 {
		slices.Sort(left)
		free := dev.Free
		logs = append(logs, func() {
			s.log.Info("gpu_watch: a process other than the backends left the GPU", "gpu", g.name, "pids", joinInts(left), "free", free)
		})
	}
	if st.below && !wasBelow {
		logs = append(logs, s.alertLocked(g.name, st, gpuEventBelowFloor, now,
			fmt.Sprintf("free memory %s is under the floor %s: the budget is cut by %s until it recovers",
				kvbudget.FormatBytes(dev.Free), kvbudget.FormatBytes(st.floor), kvbudget.FormatBytes(st.cut))))
	} else if !st.below && wasBelow {
		free := dev.Free
		logs = append(logs, func() {
			s.log.Info("gpu_watch: free memory is back over the floor, the budget is whole again", "gpu", g.name, "free", free)
		})
	}
	if st.resid && !wasResid {
		logs = append(logs, s.alertLocked(g.name, st, gpuEventResidue, now,
			fmt.Sprintf("%s of used memory is held by no listed process: residue of a finished or crashed process, or a process this host cannot see",
				kvbudget.FormatBytes(st.unattr))))
	}
	return logs
}

// alertLocked counts event on the GPU, keeps it with its snapshot as the
// GPU's last alert, and returns the warning to log.
func (s *Server) alertLocked(gpuName string, st *gpuMemState, event string, now time.Time, msg string) func() {
	st.events[event]++
	a := &gpuAlert{Event: event, At: now.UTC().Format(time.RFC3339Nano), Message: msg, Processes: slices.Clone(st.procs)}
	if st.dev != nil {
		a.Free = st.dev.Free
	}
	st.last = a
	attrs := []any{"gpu", gpuName, "event", event, "processes", snapshotText(a.Processes)}
	if st.dev != nil {
		attrs = append(attrs, "total", st.dev.Total, "used", st.dev.Used, "free", st.dev.Free, "unattributed", st.unattr)
	}
	return func() { s.log.Warn("gpu_watch: "+msg, attrs...) }
}

// snapshotText is a snapshot's processes as a log line reads them.
func snapshotText(ps []gpuProcess) string {
	if len(ps) == 0 {
		return "none listed"
	}
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteString("; ")
		}
		owner := "other"
		if p.Own {
			owner = "backend"
		}
		used := "unknown"
		if p.Used >= 0 {
			used = kvbudget.FormatBytes(p.Used)
		}
		fmt.Fprintf(&b, "%s (pid %d, %s): %s", cmpName(p.Name), p.PID, owner, used)
	}
	return b.String()
}

func cmpName(n string) string {
	if n == "" {
		return "?"
	}
	return n
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ", ")
}

// memoryCut is what the watch cuts from g's budget now: what its free
// memory lacks of the floor. 0 without a watch or a reading.
func (w *gpuWatch) memoryCut(gpuName string) int64 {
	if w == nil || w.src == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if st := w.gpus[gpuName]; st != nil {
		return st.cut
	}
	return 0
}

// poolReported notes the KV pool a backend reports and, when it is smaller
// than the one it reported before (a restart with residue on the card),
// warns with the GPU's snapshot: the processes that hold the difference.
func (s *Server) poolReported(rt *runtime, g *gpu, backend string, pool int64) {
	w := s.gpuWatch
	w.mu.Lock()
	prev, seen := w.pools[backend]
	w.pools[backend] = pool
	w.mu.Unlock()
	if !seen || pool >= prev {
		return
	}
	// A fresh reading: the holders are those on the card now.
	s.pollGPUs(context.Background())
	w.mu.Lock()
	st := w.gpus[g.name]
	if st == nil || w.src == nil {
		w.mu.Unlock()
		s.log.Warn("gpu_watch: a backend came back with a smaller KV pool; which processes hold the difference is not known (no GPU memory source)",
			"gpu", g.name, "backend", backend, "from", prev, "to", pool, "why", w.off)
		return
	}
	var holders []gpuProcess
	for _, p := range st.procs {
		if !p.Own {
			holders = append(holders, p)
		}
	}
	msg := fmt.Sprintf("backend %s came back with a KV pool of %s, %s less than before; held by other processes: %s",
		backend, kvbudget.FormatBytes(pool), kvbudget.FormatBytes(prev-pool), snapshotText(holders))
	if st.unattr > 0 && st.resid {
		msg += fmt.Sprintf("; and %s held by no listed process (residue)", kvbudget.FormatBytes(st.unattr))
	}
	log := s.alertLocked(g.name, st, gpuEventPoolShrunk, w.now(), msg)
	w.mu.Unlock()
	log()
}

// outOfMemory counts a backend's out-of-memory answer on the GPU and logs
// the GPU's snapshot, at most once an interval: a burst of failed requests
// is one event on the card.
func (s *Server) gpuOutOfMemory(rt *runtime, gpuName string) {
	w := s.gpuWatch
	if w.src == nil {
		return
	}
	now := w.now()
	w.mu.Lock()
	st := w.gpus[gpuName]
	if st == nil {
		w.mu.Unlock()
		return
	}
	if !st.oomAt.IsZero() && now.Sub(st.oomAt) < rt.cfg.GPUWatch.Interval.D {
		st.events[gpuEventOOM]++
		w.mu.Unlock()
		return
	}
	st.oomAt = now
	log := s.alertLocked(gpuName, st, gpuEventOOM, now, "a backend ran out of memory on the GPU; what held it at the last reading follows")
	w.mu.Unlock()
	log()
}

// pickDevice finds the device a selector names: an index, a UUID, or ""
// for the only device.
func pickDevice(devs []gpuinfo.Device, sel string) *gpuinfo.Device {
	if sel == "" {
		if len(devs) == 1 {
			return &devs[0]
		}
		return nil
	}
	for i := range devs {
		if strings.EqualFold(devs[i].UUID, sel) || strconv.Itoa(devs[i].Index) == sel {
			return &devs[i]
		}
	}
	return nil
}

// deviceOf is the selector of a GPU's device: the gpu_device its backends
// name, else the index of their gpu_memory: nvml[:N], else "" (the
// source's only device).
func (rt *runtime) deviceOf(gpuName string) string {
	nvmlIdx := ""
	for _, b := range rt.cfg.Backends {
		if b.GPU != gpuName {
			continue
		}
		if b.GPUDevice != "" {
			return b.GPUDevice
		}
		if nvmlIdx == "" && strings.HasPrefix(b.GPUMemory, "nvml") {
			nvmlIdx = "0"
			if rest, ok := strings.CutPrefix(b.GPUMemory, "nvml:"); ok {
				nvmlIdx = rest
			}
		}
	}
	return nvmlIdx
}

// backendPorts are the TCP ports of g's backends' URLs.
func (rt *runtime) backendPorts(g *gpu) []int {
	var out []int
	for _, b := range g.backends {
		u, err := url.Parse(b.Spec().URL)
		if err != nil {
			continue
		}
		port, err := strconv.Atoi(u.Port())
		if err != nil {
			port = 80
			if u.Scheme == "https" {
				port = 443
			}
		}
		out = append(out, port)
	}
	return out
}

func sortedGPUNames(rt *runtime) []string {
	names := make([]string, 0, len(rt.gpus))
	for n := range rt.gpus {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// gpuMemoryView is a GPU's memory on /status.
type gpuMemoryView struct {
	Device       string           `json:"device"`
	Total        int64            `json:"total_bytes"`
	Used         int64            `json:"used_bytes"`
	Free         int64            `json:"free_bytes"`
	Floor        int64            `json:"free_floor_bytes"`
	BelowFloor   bool             `json:"below_floor"`
	Other        int64            `json:"other_processes_bytes"`
	Unattributed int64            `json:"unattributed_bytes"`
	Residue      bool             `json:"residue"`
	Processes    []gpuProcess     `json:"processes"`
	Events       map[string]int64 `json:"events"`
	LastAlert    *gpuAlert        `json:"last_alert,omitempty"`
}

// budgetCutView is one named reduction of a GPU's budget on /status.
type budgetCutView struct {
	Cause string `json:"cause"`
	Bytes int64  `json:"bytes"`
	Why   string `json:"why"`
}

// gpuWatchView is the watch itself on /status.
type gpuWatchView struct {
	Source string `json:"source,omitempty"`
	Off    string `json:"off,omitempty"` // why nothing is watched
	ReadAt string `json:"read_at,omitempty"`
	Error  string `json:"error,omitempty"` // the last reading's
}

// statusView is the watch on /status, and fills each GPU's memory and its
// budget's cut.
func (w *gpuWatch) status(gpus []gpuView) *gpuWatchView {
	v := &gpuWatchView{Source: w.source, Off: w.off}
	if w.src == nil {
		return v
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.readAt.IsZero() {
		v.ReadAt = w.readAt.UTC().Format(time.RFC3339Nano)
	}
	v.Error = w.readErr
	for i := range gpus {
		st := w.gpus[gpus[i].GPU]
		if st == nil || st.dev == nil {
			continue
		}
		d := st.dev
		mv := &gpuMemoryView{Device: strconv.Itoa(d.Index), Total: d.Total, Used: d.Used, Free: d.Free, Floor: st.floor,
			BelowFloor: st.below, Other: st.other, Unattributed: st.unattr, Residue: st.resid,
			Processes: slices.Clone(st.procs), Events: map[string]int64{}, LastAlert: st.last}
		if d.UUID != "" {
			mv.Device += " " + d.UUID
		}
		for _, e := range gpuEvents {
			mv.Events[e] = st.events[e]
		}
		gpus[i].Memory = mv
		if st.cut > 0 {
			gpus[i].Cuts = append(gpus[i].Cuts, budgetCutView{Cause: "gpu_free_below_floor", Bytes: st.cut,
				Why: fmt.Sprintf("the GPU has %s free, under gpu_watch.free_floor %s; other processes hold %s",
					kvbudget.FormatBytes(d.Free), kvbudget.FormatBytes(st.floor), kvbudget.FormatBytes(st.other))})
		}
	}
	return v
}
