package loadtest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama-3-8b"} 5.0
vllm:num_requests_running{engine="1",model_name="llama-3-8b"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama-3-8b"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama-3-8b"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="llama-3-8b"} 0.61
vllm:gpu_cache_usage_perc{engine="0",model_name="llama-3-8b"} 0.99
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="llama-3-8b"} 7.0 1700000000000
vllm:num_preemptions_total{engine="1",model_name="llama-3-8b"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",label_with_brace="a}b \"q\"",num_gpu_blocks="2048"} 1.0
kvsim_oom_events_total 2
kvsim_kv_usage_peak_ratio 0.93
kvsim_healthy{engine="0"} 1
kvsim_healthy{engine="1"} 0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="llama-3-8b"} 12
python_gc_objects_collected_total{generation="0"} NaN
`

func TestParseMetrics(t *testing.T) {
	s, err := ParseMetrics([]byte(vllmMetrics))
	if err != nil {
		t.Fatal(err)
	}
	// KV: the fullest engine, from the V1 name in preference to the old one.
	if !s.HasKV || s.KVUsage != 0.61 || s.KVSource != metricKVUsage {
		t.Errorf("kv = %v %g %s", s.HasKV, s.KVUsage, s.KVSource)
	}
	if s.Running != 8 || s.Waiting != 2 || s.Preemptions != 8 {
		t.Errorf("running %g waiting %g preemptions %g, want 8 2 8 (sums over engines)", s.Running, s.Waiting, s.Preemptions)
	}
	if s.NumGPUBlocks != 2048 || s.BlockSize != 16 {
		t.Errorf("cache config %d blocks of %d", s.NumGPUBlocks, s.BlockSize)
	}
	if !s.HasOOM || s.OOMEvents != 2 || !s.HasKVPeak || s.KVPeak != 0.93 || !s.HasHealthy || s.Healthy {
		t.Errorf("sim extras: %+v", s)
	}

	old, err := ParseMetrics([]byte("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\n"))
	if err != nil || !old.HasKV || old.KVUsage != 0.5 || old.KVSource != metricGPUCache || old.HasRunning {
		t.Errorf("pre-V1 server: %+v %v", old, err)
	}
	none, err := ParseMetrics([]byte("process_cpu_seconds_total 12.5\n"))
	if err != nil || none.HasKV || none.HasPreemptions {
		t.Errorf("server without vLLM metrics: %+v %v", none, err)
	}
	if _, err := ParseMetrics([]byte("<html>not found</html>\n")); err == nil {
		t.Error("an HTML page parsed as metrics")
	}
	// As Prometheus does, a page with a line that is not the format is
	// refused whole, naming the line, rather than read in part.
	if _, err := ParseMetrics([]byte(vllmMetrics + "a line that is not a sample\n")); err == nil || !strings.Contains(err.Error(), "line 21") {
		t.Errorf("a malformed line: %v", err)
	}
}

func TestScrapeMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, vllmMetrics)
	}))
	defer srv.Close()
	s, err := scrapeMetrics(context.Background(), srv.Client(), srv.URL+"/metrics", time.Second)
	if err != nil || s.KVUsage != 0.61 {
		t.Errorf("scrape: %+v %v", s, err)
	}
	if _, err := scrapeMetrics(context.Background(), srv.Client(), srv.URL+"/nope", time.Second); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
		t.Errorf("404 scrape: %v", err)
	}
}

// FuzzParseMetrics: any body parses or errs, never panics, and a KV usage
// it reports came from a sample line.
func FuzzParseMetrics(f *testing.F) {
	f.Add([]byte(vllmMetrics))
	f.Add([]byte("vllm:kv_cache_usage_perc 0.5\n"))
	f.Add([]byte(`vllm:cache_config_info{num_gpu_blocks="1` + "\n"))
	f.Add([]byte(`x{a="\` + "\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := ParseMetrics(body)
		if s.HasKV && !strings.Contains(string(body), "cache_usage_perc") {
			t.Fatalf("KV usage from nowhere: %+v (err %v)", s, err)
		}
	})
}
