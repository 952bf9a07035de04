package loadtest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// fakeOpenAI is a minimal OpenAI-compatible server with vLLM-style metrics
// whose KV usage is its in-flight count over kvSlots. More than oomAbove
// requests at once fail with a CUDA out-of-memory error. It has no
// /tokenize unless tokenize is set.
type fakeOpenAI struct {
	kvSlots, oomAbove int64
	tokenize          bool
	inflight          atomic.Int64
	peak              atomic.Int64
	served            atomic.Int64
}

func (f *fakeOpenAI) start(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","object":"model","max_model_len":4096}]}`)
	})
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		n := f.inflight.Load()
		fmt.Fprintf(w, "vllm:kv_cache_usage_perc{model_name=\"fake-model\"} %g\n", float64(f.peak.Swap(n))/float64(f.kvSlots))
		fmt.Fprintf(w, "vllm:num_requests_running{model_name=\"fake-model\"} %d\nvllm:num_requests_waiting{model_name=\"fake-model\"} 0\n", n)
		fmt.Fprint(w, "vllm:num_preemptions_total{model_name=\"fake-model\"} 0\n")
	})
	if f.tokenize {
		mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `{"count":3,"max_model_len":4096,"tokens":[1,2,3]}`)
		})
	}
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		n := f.inflight.Add(1)
		defer f.inflight.Add(-1)
		for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
		}
		if n > f.oomAbove {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"message":"CUDA out of memory. Tried to allocate 1.00 GiB","type":"InternalServerError","code":500}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 4 {
			time.Sleep(2 * time.Millisecond)
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"},\"finish_reason\":null}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n")
		f.served.Add(1)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// fakeRun sweeps 1,2,4,8 against a fakeOpenAI that overflows above 5 in
// flight: 4 is safe (KV 50% of 8 slots), 8 overflows.
func fakeRun(t *testing.T, edit func(*Config)) *Report {
	t.Helper()
	return fakeRunOn(t, &fakeOpenAI{kvSlots: 8, oomAbove: 5}, edit)
}

func fakeRunOn(t *testing.T, f *fakeOpenAI, edit func(*Config)) *Report {
	t.Helper()
	url := f.start(t)
	cfg := Config{
		Targets: []Target{{Name: "fake", URL: url}}, Concurrency: []int{1, 2, 4, 8},
		Requests: 24, Warmup: -1, ScrapeInterval: 10 * time.Millisecond, Cooldown: time.Second, OutputTokens: fixed(4), PromptTokens: fixed(50),
	}
	if edit != nil {
		edit(&cfg)
	}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}
