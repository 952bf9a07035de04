package sim

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"
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
		"kvsim:oom_events_total" + lbl:                 0,
		"kvsim:kv_usage_peak_perc" + lbl:               float64(st.PeakUsedBlocks) / 64,
		"kvsim:gpu_memory_total_bytes" + lbl:           float64(c.GPUMemory),
		"kvsim:kv_cache_used_blocks" + lbl:             0,
		"kvsim:kv_cache_used_blocks_peak" + lbl:        float64(st.PeakUsedBlocks),
		"kvsim:healthy" + lbl:                          1,
		"vllm:time_to_first_token_seconds_count" + lbl: 4,
		"vllm:e2e_request_latency_seconds_count" + lbl: 4,
		`vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="1",model_name="llama-3-8b",num_cpu_blocks="None",num_gpu_blocks="64"}`: 1,
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
	if m["vllm:num_requests_running"+lbl] != 1 || m["kvsim:kv_cache_used_blocks"+lbl] != 7 {
		t.Fatalf("running %g, used blocks %g; want 1 and 7", m["vllm:num_requests_running"+lbl], m["kvsim:kv_cache_used_blocks"+lbl])
	}
	if u := m["vllm:kv_cache_usage_perc"+lbl]; u != 7.0/2888 {
		t.Fatalf("kv usage %g, want 7/2888", u)
	}
}
