package loadtest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeOpenAI is a minimal OpenAI-compatible server with vLLM-style metrics
// whose KV usage is its in-flight count over kvSlots. More than oomAbove
// requests at once fail with a CUDA out-of-memory error. It has no
// /tokenize unless tokenize is set.
//
// So that what a level shows does not depend on how fast a busy machine
// starts its workers, the fake knows the level being run (gang, fed by the
// run's progress): at the start of each closed-loop step it holds the first
// requests until as many are in flight as the level can reach — the level
// itself, or one past oomAbove — as a server's batch would gather them.
type fakeOpenAI struct {
	kvSlots, oomAbove int64
	tokenize          bool
	inflight          atomic.Int64
	peak              atomic.Int64
	served            atomic.Int64

	mu        sync.Mutex    // guards the fields below
	gangSize  int64         // requests to gather at the step's start; 0: none
	gangPeak  int64         // most in flight since the step started
	gangMoved chan struct{} // closed (and replaced) when gangPeak rises
}

// stepStarted tells the fake that a step of the given mode and level begins.
func (f *fakeOpenAI) stepStarted(mode Mode, level float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gangSize, f.gangPeak = 0, f.inflight.Load()
	if mode == ModeConcurrency {
		f.gangSize = min(int64(level), f.oomAbove+1)
	}
	if f.gangMoved == nil {
		f.gangMoved = make(chan struct{})
	}
}

// arrived records a request now in flight (n of them) and holds it until
// the step's gang is complete. The wait is bounded, so a step whose last
// round is smaller than the level is not stuck.
func (f *fakeOpenAI) arrived(n int64) {
	f.mu.Lock()
	if n > f.gangPeak {
		f.gangPeak = n
		if f.gangMoved != nil {
			close(f.gangMoved)
			f.gangMoved = make(chan struct{})
		}
	}
	deadline := time.After(2 * time.Second)
	for f.gangPeak < f.gangSize {
		moved := f.gangMoved
		f.mu.Unlock()
		select {
		case <-moved:
		case <-deadline:
			return
		}
		f.mu.Lock()
	}
	f.mu.Unlock()
}

// gangProgress feeds each step's start to the fake behind its target.
type gangProgress struct {
	Progress
	fakes map[string]*fakeOpenAI // by target name
}

func (g gangProgress) StepStart(s StepInfo) {
	if f := g.fakes[s.Target]; f != nil {
		f.stepStarted(s.Mode, s.Level)
	}
	g.Progress.StepStart(s)
}

// withGang makes cfg's steps known to the fakes, given in the order of
// cfg.Targets.
func withGang(cfg *Config, fakes ...*fakeOpenAI) {
	p := cfg.Progress
	if p == nil {
		p = nopProgress{}
	}
	g := gangProgress{Progress: p, fakes: map[string]*fakeOpenAI{}}
	for i, f := range fakes {
		g.fakes[cfg.Targets[i].Name] = f
	}
	cfg.Progress = g
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
		f.arrived(n) // one past oomAbove completes the gang, then fails
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
	withGang(&cfg, f)
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}
