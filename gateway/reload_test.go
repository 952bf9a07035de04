package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends/sim"
)

func capacity(s *Server) int64 { return onlyGPU(s).Capacity }

// A reload changes the ceiling under a running gateway without dropping
// the stream in flight; a broken file, or one whose numbers do not add up,
// is refused and the running configuration stays.
func TestReload(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 0.1 })
	dir := t.TempDir()
	path := filepath.Join(dir, "kvgate.yaml")
	write := func(extra string) {
		if err := os.WriteFile(path, []byte(baseConfig(url, extra)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("admission: {ceiling: 0.75}\n")
	gw, gwURL := startGateway(t, baseConfig(url, "admission: {ceiling: 0.75}\n"), Options{})
	// 24 GiB × 0.75 − 16,060,522,496 − 1 GiB
	if c := capacity(gw); c != 2193088512 {
		t.Fatalf("capacity %d", c)
	}
	sched := gw.rt.Load().sched

	// A stream in flight across the reloads.
	done := make(chan result, 1)
	go func() { done <- postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 300, true)) }()
	eventually(t, "the stream to be admitted", func() bool { return held(gw) > 0 })

	write("admission: {ceiling: 0.8}\n")
	cfg, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	// 24 GiB × 0.8 = 20,615,843,020 (truncated) − weights − 1 GiB
	if c := capacity(gw); c != 3481578700 {
		t.Errorf("capacity after reload %d, want 3481578700", c)
	}
	if gw.rt.Load().sched != sched || held(gw) == 0 {
		t.Error("the admission state was replaced: reservations in flight would be lost")
	}

	write("admission: {ceiling: 2}\n")
	if _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), "admission.ceiling") {
		t.Errorf("a broken file loaded: %v", err)
	}
	// Valid YAML whose budget cannot exist: the weights do not fit at 0.5.
	write("admission: {ceiling: 0.5}\n")
	cfg, err = LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Reload(cfg); err == nil || !strings.Contains(err.Error(), "weights do not fit") {
		t.Errorf("reload with no room: %v", err)
	}
	if c := capacity(gw); c != 3481578700 {
		t.Errorf("a refused reload changed the capacity to %d", c)
	}

	r := <-done
	if r.status != 200 || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
		t.Errorf("stream across reloads: %d %.200s", r.status, r.body)
	}
	eventually(t, "the reservation to return", func() bool { return held(gw) == 0 })
}

// clampConfig gives the gateway a budget (20 GiB) far larger than the
// simulator's real pool (2888 blocks, 6.06 GB), so the budget must follow
// the pool the backend reports.
func clampConfig(url string) string {
	return strings.Replace(baseConfig(url, "admission:\n  queue: {timeout: 60s}\n"), "gpu_memory: 24GiB", "kv_budget: 20GiB", 1)
}

// Review finding: a reload reset a pool-clamped budget to its configured
// size and dispatched the queue at once, admitting past the pool.
func TestReloadKeepsThePoolClamp(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	gw, gwURL := startGateway(t, clampConfig(url), Options{})
	pool := backend.Stats().NumGPUBlocks * (2 << 20)
	eventually(t, "the budget to follow the pool", func() bool { return capacity(gw) == pool })
	// Fill the pool with 500-block requests, and queue two more.
	fill := int(backend.Stats().NumGPUBlocks / 500)
	for range fill + 2 {
		c, _ := rawRequest(t, gwURL, "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":7990}`)
		defer c.Close()
	}
	eventually(t, "the queue", func() bool { return queued(gw) == 2 })
	cfg, err := Parse([]byte(clampConfig(url)), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if c := capacity(gw); c != pool {
		t.Errorf("capacity after reload %d, want the pool %d", c, pool)
	}
	if h := held(gw); h > pool || queued(gw) != 2 {
		t.Errorf("after a no-op reload: held %d (pool %d), queued %d", h, pool, queued(gw))
	}
}

// Review finding: renaming a backend (whose GPU defaults to its name) made
// a second, empty budget for the same GPU while the old one still held the
// streams running there.
func TestReloadRenamedBackendKeepsItsBudget(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	c, _ := rawRequest(t, gwURL, "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":7990}`)
	defer c.Close()
	eventually(t, "the request to be admitted", func() bool { return held(gw) > 0 })
	cfg, err := Parse([]byte(strings.Replace(baseConfig(url, ""), "name: gpu0", "name: vllm-0", 1)), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	g := gw.rt.Load().gpus["vllm-0"]
	if g == nil || g.id != "gpu0" || held(gw) == 0 || len(gw.rt.Load().sched.Stats().GPUs) != 1 {
		t.Fatalf("the renamed backend's GPU has a new budget: %+v", gw.rt.Load().gpus)
	}
}

// Review finding: the pool was read in the gateway's block size, not the
// one the backend reports.
func TestPoolUsesTheBackendsBlockSize(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) { c.BlockSize = 32 })
	gw, _ := startGateway(t, clampConfig(url), Options{})
	st := backend.Stats()
	pool := st.NumGPUBlocks * int64(st.BlockSize) * 131072
	eventually(t, "the budget to follow the pool", func() bool { return capacity(gw) == pool })
}

// The HTTP server's limits are fixed when it starts: a reload that changes
// them keeps the running ones (and says so), so request_timeout never drifts
// away from the write deadline fasthttp enforces.
func TestReloadKeepsTheServerSection(t *testing.T) {
	_, url := startSim(t, nil)
	gw, _ := startGateway(t, baseConfig(url, "server: {request_timeout: 1m}\n"), Options{})
	cfg, err := Parse([]byte(baseConfig(url, "server: {request_timeout: 20m}\n")), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if got := gw.rt.Load().cfg.Server.RequestTimeout.D; got != time.Minute {
		t.Errorf("request_timeout after reload %s, want the running 1m", got)
	}
}

// Issue 26, R1: a request queued before a reload that added a GPU could be
// bound to that GPU, which its own runtime snapshot does not know: it was
// answered 500 from a nil-pointer panic instead of being served there.
func TestReloadServesAQueuedRequestOnANewGPU(t *testing.T) {
	_, slow := startSim(t, func(c *sim.Config) { c.TimeScale = 1 }) // 500 tokens take ~8 s: longer than the test
	_, fast := startSim(t, nil)
	extra := "admission: {mode: count, max_concurrency: 1, queue: {timeout: 60s}}\n"
	gw, gwURL := startGateway(t, fleetConfig(extra, slow), Options{})
	c, _ := rawRequest(t, gwURL, "/v1/chat/completions", chatBody("hi", 500, true))
	defer c.Close()
	eventually(t, "the first request to hold the only GPU", func() bool { return held(gw) > 0 })
	done := make(chan result, 1)
	go func() { done <- postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 5, false)) }()
	eventually(t, "the second request to queue", func() bool { return queued(gw) == 1 })

	cfg, err := Parse([]byte(fleetConfig(extra, slow, fast)), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.status != 200 {
		t.Fatalf("the queued request, bound to the new GPU: %d %v %.300s", r.status, r.err, r.body)
	}
}

// Issue 26, R4: a backend removed by one reload and added back by the next
// is the GPU it was, still running the requests it had: its pool must count
// them, not start from zero and admit as many again.
func TestReloadReaddedGPUKeepsItsRequests(t *testing.T) {
	_, slow0 := startSim(t, func(c *sim.Config) { c.TimeScale = 1 }) // 500 tokens take ~8 s: longer than the test
	_, slow1 := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	extra := "admission: {mode: count, max_concurrency: 1, queue: {timeout: 60s}}\n"
	gw, gwURL := startGateway(t, fleetConfig(extra, slow0, slow1), Options{})
	for range 2 { // one stream on each GPU
		c, _ := rawRequest(t, gwURL, "/v1/chat/completions", chatBody("hi", 500, true))
		defer c.Close()
	}
	eventually(t, "a stream on each GPU", func() bool { return gpuStats(gw, "gpu0").Held == 1 && gpuStats(gw, "gpu1").Held == 1 })
	reload := func(urls ...string) {
		t.Helper()
		cfg, err := Parse([]byte(fleetConfig(extra, urls...)), ".")
		if err != nil {
			t.Fatal(err)
		}
		if err := gw.Reload(cfg); err != nil {
			t.Fatal(err)
		}
	}
	reload(slow0)
	reload(slow0, slow1)
	if h := gpuStats(gw, "gpu1").Held; h != 1 {
		t.Fatalf("gpu1 added back holds %d, want the 1 stream still running on it", h)
	}
}
