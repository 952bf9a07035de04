package sim

import (
	"bufio"
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/metricdoc"
)

// scrape reads /metrics into series → value, a series being the name with
// its labels as exposed, e.g. `vllm:num_requests_running{engine="0",model_name="m"}`.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

func TestMetricsNamesAndValues(t *testing.T) {
	c := poolConfig(64)
	c.MaxModelLen = 512
	c.TimeScale = 0.01
	s, base := startServer(t, c)
	// Four requests of 32 blocks on 64: preemptions happen.
	done := make(chan struct{})
	for i := range 4 {
		go func() {
			post(t, base+"/v1/completions", longBody(i, false))
			done <- struct{}{}
		}()
	}
	for range 4 {
		<-done
	}
	st := s.Stats()
	m := scrape(t, base)
	lbl := `{engine="0",model_name="llama-3-8b"}`
	want := map[string]float64{
		"vllm:num_requests_running" + lbl:              0,
		"vllm:num_requests_waiting" + lbl:              0,
		"vllm:kv_cache_usage_perc" + lbl:               0,
		"vllm:gpu_cache_usage_perc" + lbl:              0,
		"vllm:num_preemptions_total" + lbl:             float64(st.Preemptions),
		"vllm:prompt_tokens_total" + lbl:               400,
		"vllm:generation_tokens_total" + lbl:           1600,
		"kvsim_oom_events_total" + lbl:                 0,
		"kvsim_kv_usage_peak_ratio" + lbl:              float64(st.PeakUsedBlocks) / 64,
		"kvsim_gpu_memory_bytes" + lbl:                 float64(c.GPUMemory),
		"kvsim_kv_cache_used_blocks" + lbl:             0,
		"kvsim_kv_cache_peak_used_blocks" + lbl:        float64(st.PeakUsedBlocks),
		"kvsim_healthy" + lbl:                          1,
		"vllm:time_to_first_token_seconds_count" + lbl: 4,
		"vllm:e2e_request_latency_seconds_count" + lbl: 4,
		`vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="1",model_name="llama-3-8b",num_cpu_blocks="None",num_gpu_blocks="64"}`: 1,
	}
	for series, v := range want {
		got, ok := m[series]
		if !ok {
			t.Errorf("missing %s", series)
			continue
		}
		if got != v {
			t.Errorf("%s = %g, want %g", series, got, v)
		}
	}
	if st.Preemptions == 0 || st.PeakUsedBlocks != 64 {
		t.Errorf("the workload did not fill the pool: %+v", st)
	}
	// vLLM's TTFT buckets.
	if _, ok := m[`vllm:time_to_first_token_seconds_bucket{engine="0",model_name="llama-3-8b",le="0.001"}`]; !ok {
		t.Error("TTFT histogram lacks vLLM's 1 ms bucket")
	}
}

func TestMetricsWhileRunning(t *testing.T) {
	// Slow steps: the first token comes after 0.5 s, and the request keeps
	// its 7 blocks for 11 more steps, time enough to scrape.
	s, base := startServer(t, Config{TimeScale: 1, StepBase: 500 * time.Millisecond})
	r := newRequest(100, 1000, 1, s.now())
	r.seqs[0].target = 1000
	if err := s.eng.submit(r); err != nil {
		t.Fatal(err)
	}
	defer s.eng.abort(r)
	for r.seqs[0].pub.Load() == 0 {
		<-r.wake
	}
	m := scrape(t, base)
	lbl := `{engine="0",model_name="llama-3-8b"}`
	if m["vllm:num_requests_running"+lbl] != 1 || m["kvsim_kv_cache_used_blocks"+lbl] != 7 {
		t.Fatalf("running %g, used blocks %g; want 1 and 7", m["vllm:num_requests_running"+lbl], m["kvsim_kv_cache_used_blocks"+lbl])
	}
	if u := m["vllm:kv_cache_usage_perc"+lbl]; u != 7.0/2888 {
		t.Fatalf("kv usage %g, want 7/2888", u)
	}
}

// The simulator's /metrics is the table in docs/METRICS.md, and its own
// names follow the rules there (vLLM's keep vLLM's spelling).
func TestMetricsMatchDocs(t *testing.T) {
	c := poolConfig(64)
	c.MaxModelLen = 512
	c.TimeScale = 0.01
	_, base := startServer(t, c)
	post(t, base+"/v1/completions", longBody(0, false))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fams, err := metricdoc.Scrape(ctx, base+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := metricdoc.ParseFile("../../docs/METRICS.md", "kvgate sim")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range metricdoc.Compare(rows, fams, nil) {
		t.Error(d)
	}
	vllm := func(name string) bool { return strings.HasPrefix(name, "vllm:") }
	for _, p := range metricdoc.Lint(fams, vllm) {
		t.Error(p)
	}
}

// vllm:request_success_total counts requests by vLLM's finished_reason:
// length when every sequence reached max_tokens, stop when one ended
// early, abort when the client left; every reason exists from the start.
func TestRequestSuccessByFinishedReason(t *testing.T) {
	c := poolConfig(64)
	c.MaxModelLen = 512
	c.TimeScale = 0.01
	s, base := startServer(t, c)
	lbl := func(reason string) string {
		return `vllm:request_success_total{engine="0",finished_reason="` + reason + `",model_name="llama-3-8b"}`
	}
	m := scrape(t, base)
	for _, r := range []string{"stop", "length", "abort"} {
		if v, ok := m[lbl(r)]; !ok || v != 0 {
			t.Errorf("%s = %g (present %v) before any request, want 0", lbl(r), v, ok)
		}
	}
	post(t, base+"/v1/completions", longBody(0, false)) // runs to max_tokens
	r := newRequest(10, 100, 1, s.now())
	r.seqs[0].target = 100
	if err := s.eng.submit(r); err != nil {
		t.Fatal(err)
	}
	s.eng.abort(r)
	st := s.Stats()
	m = scrape(t, base)
	if m[lbl("length")] != 1 || m[lbl("abort")] != 1 || m[lbl("stop")] != 0 {
		t.Errorf("stop %g, length %g, abort %g; want 0, 1, 1 (stats %+v)", m[lbl("stop")], m[lbl("length")], m[lbl("abort")], st)
	}
}
