// Command gpu runs gpu_watch's checks on a real NVIDIA GPU: kvgate sim and
// a gateway watching GPU 0 through NVML, then a real process (bench/gpu/alloc,
// through the CUDA driver API) allocating memory on the card beside them.
// It checks that the gateway names the process as another's on /status and
// /metrics, cuts the GPU's budget while the card's free memory is under the
// floor, logs the warning with the snapshot, and gives the budget back when
// the process exits.
//
//	go run ./bench/gpu [--device 0] [--mib 0 (half the free memory, at most 16 GiB)]
//
// Where there is no NVIDIA GPU (nvidia-smi fails) it says so and exits 0:
// the rest of the checks are the gateway's tests, on go-nvml's mock.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

func main() {
	device := flag.Int("device", 0, "the GPU (index) to check on")
	mib := flag.Int64("mib", 0, "MiB the other process allocates; 0: half the free memory, at most 16 GiB")
	flag.Parse()
	benchkit.Main("bench/gpu", func(ctx context.Context) error { return run(ctx, *device, *mib) })
}

// status is what the checks read of /status.
type status struct {
	GPUWatch struct {
		Source string `json:"source"`
		Off    string `json:"off"`
		ReadAt string `json:"read_at"`
		Error  string `json:"error"`
	} `json:"gpu_watch"`
	GPUs []struct {
		Capacity int64 `json:"capacity_bytes"`
		Cuts     []struct {
			Cause string `json:"cause"`
			Bytes int64  `json:"bytes"`
		} `json:"budget_cuts"`
		Memory *struct {
			Free       int64 `json:"free_bytes"`
			BelowFloor bool  `json:"below_floor"`
			Processes  []struct {
				PID     int    `json:"pid"`
				Name    string `json:"name"`
				Used    int64  `json:"used_bytes"`
				Backend bool   `json:"backend"`
			} `json:"processes"`
		} `json:"gpu_memory"`
	} `json:"gpus"`
}

func run(ctx context.Context, device int, mib int64) error {
	free, total, err := nvidiaSMI(ctx, device)
	if err != nil {
		fmt.Printf("bench/gpu: SKIPPED, no NVIDIA GPU here (%v)\n", err)
		return nil
	}
	if mib == 0 {
		mib = min(free/2, 16<<10)
	}
	// Free after the allocation is about free − mib (and the context's own
	// few hundred MiB): a floor at free − mib/2 is crossed by about mib/2.
	floor := free - mib/2
	k, err := benchkit.New(ctx, "kvgate-gpu-", "", "")
	if err != nil {
		return err
	}
	defer k.StopAll()
	k.Header(os.Stdout, "gpu", fmt.Sprintf("GPU %d: %d MiB, %d MiB free; another process allocates %d MiB; free_floor %d MiB", device, total, free, mib, floor), "logs")
	alloc := k.Path("alloc")
	build := exec.CommandContext(ctx, "go", "build", "-o", alloc, "./bench/gpu/alloc")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("go build ./bench/gpu/alloc: %w", err)
	}
	// The simulated backend's pool is sized for the card, so that the
	// budget is large beside the cut.
	sim, err := k.StartSim(ctx, "sim", "--gpu-memory", fmt.Sprintf("%dMiB", total))
	if err != nil {
		return err
	}
	gw, err := k.StartGatewayOver(ctx, "gpu", "0.9", "",
		fmt.Sprintf("gpu_watch: {source: nvml, interval: 500ms, free_floor: %dMiB}\n", floor),
		fmt.Sprintf("  - name: sim0\n    url: %s\n    models: [%s]\n    gpu_memory: %dMiB\n    gpu_device: '%d'\n", sim.URL, benchkit.Model, total, device))
	if err != nil {
		return err
	}
	c := &http.Client{Timeout: 5 * time.Second}
	read := func() (status, error) {
		var st status
		err := benchkit.Status(ctx, c, gw.URL, &st)
		if err == nil && len(st.GPUs) != 1 {
			err = fmt.Errorf("/status has %d GPUs", len(st.GPUs))
		}
		return st, err
	}
	// wait polls /status until cond holds: a benchmark against real
	// processes, so on the wall clock.
	wait := func(what string, cond func(status) bool) (status, error) {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			st, err := read()
			if err == nil && cond(st) {
				return st, nil
			}
			if time.Now().After(deadline) {
				return st, fmt.Errorf("%s: not within 30s (last error %v)", what, err)
			}
		}
	}
	before, err := wait("a first reading", func(st status) bool { return st.GPUWatch.ReadAt != "" && st.GPUs[0].Memory != nil })
	if err != nil {
		return fmt.Errorf("%w; gpu_watch %+v", err, before.GPUWatch)
	}
	ok := benchkit.Check(os.Stdout, before.GPUWatch.Source == "nvml" && !before.GPUs[0].Memory.BelowFloor && len(before.GPUs[0].Cuts) == 0,
		"before: watched through NVML, free %d MiB over the floor, no cut (capacity %d MiB)", before.GPUs[0].Memory.Free>>20, before.GPUs[0].Capacity>>20)

	other, err := k.Exec(ctx, "alloc", alloc, "--device", strconv.Itoa(device), "--mib", strconv.FormatInt(mib, 10))
	if err != nil {
		return err
	}
	pid := other.Pid()
	during, err := wait("the other process on /status", func(st status) bool {
		m := st.GPUs[0].Memory
		if m == nil || !m.BelowFloor {
			return false
		}
		for _, p := range m.Processes {
			if p.PID == pid {
				return true
			}
		}
		return false
	})
	if err != nil {
		log, _ := os.ReadFile(other.Log)
		return fmt.Errorf("%w; alloc's log: %s", err, bytes.TrimSpace(log))
	}
	var named bool
	var held int64
	for _, p := range during.GPUs[0].Memory.Processes {
		if p.PID == pid {
			named, held = !p.Backend, p.Used
		}
	}
	cut := int64(0)
	for _, ct := range during.GPUs[0].Cuts {
		if ct.Cause == "gpu_free_below_floor" {
			cut = ct.Bytes
		}
	}
	ok = benchkit.Check(os.Stdout, named && held >= mib<<20, "the process (pid %d) is another's on /status, holding %d MiB (allocated %d)", pid, held>>20, mib) && ok
	ok = benchkit.Check(os.Stdout, cut > 0 && during.GPUs[0].Capacity <= max(before.GPUs[0].Capacity-cut, 1),
		"the budget is cut by %d MiB while free memory is under the floor (capacity %d → %d MiB)", cut>>20, before.GPUs[0].Capacity>>20, during.GPUs[0].Capacity>>20) && ok
	m, err := benchkit.Scrape(ctx, c, gw.URL+"/metrics")
	if err != nil {
		return err
	}
	var series float64
	for name, v := range m {
		if strings.HasPrefix(name, "kvgate_gpu_process_memory_bytes{") && strings.Contains(name, `pid="`+strconv.Itoa(pid)+`"`) && strings.Contains(name, `owner="other"`) {
			series = v
		}
	}
	ok = benchkit.Check(os.Stdout, series >= float64(mib<<20), "kvgate_gpu_process_memory_bytes{pid=%q,owner=\"other\"} = %.0f MiB", strconv.Itoa(pid), series/(1<<20)) && ok
	log, _ := os.ReadFile(gw.Log)
	ok = benchkit.Check(os.Stdout, bytes.Contains(log, []byte("gpu_watch: another process took memory on the GPU: pid "+strconv.Itoa(pid))) &&
		bytes.Contains(log, []byte("event=below_floor")), "the gateway logged the contention and the floor, with the snapshot") && ok

	other.Stop()
	after, err := wait("the budget given back", func(st status) bool {
		return st.GPUs[0].Memory != nil && !st.GPUs[0].Memory.BelowFloor && len(st.GPUs[0].Cuts) == 0
	})
	ok = benchkit.Check(os.Stdout, err == nil && after.GPUs[0].Capacity == before.GPUs[0].Capacity,
		"after the process exits: no cut, capacity %d MiB again", after.GPUs[0].Capacity>>20) && ok
	if !ok {
		return fmt.Errorf("a check failed; logs in %s", k.Dir)
	}
	return nil
}

// nvidiaSMI reads a GPU's free and total memory, in MiB.
func nvidiaSMI(ctx context.Context, device int) (free, total int64, err error) {
	out, err := exec.CommandContext(ctx, "nvidia-smi", "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits", "-i", strconv.Itoa(device)).Output()
	if err != nil {
		return 0, 0, fmt.Errorf("nvidia-smi: %w", err)
	}
	f, t, ok := strings.Cut(strings.TrimSpace(string(out)), ",")
	if !ok {
		return 0, 0, fmt.Errorf("nvidia-smi said %q", out)
	}
	if free, err = strconv.ParseInt(strings.TrimSpace(f), 10, 64); err == nil {
		total, err = strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	}
	return free, total, err
}
