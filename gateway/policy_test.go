package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends/sim"
)

func getStatus(t *testing.T, gwURL string) statusView {
	t.Helper()
	resp, err := http.Get(gwURL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st statusView
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// A backend that allocated its pool at vLLM's default 0.9 behind the
// gateway's 0.75 ceiling keeps memory nobody may use: /status says how
// much, and how to fix it. At the ceiling, the budget is the whole pool
// and there is nothing to say.
func TestPoolLargerThanTheCeilingIsReported(t *testing.T) {
	for _, tc := range []struct {
		utilization float64
		warn        bool
	}{{0.9, true}, {0.75, false}} {
		t.Run(fmt.Sprint(tc.utilization), func(t *testing.T) {
			_, url := startSim(t, func(c *sim.Config) { c.GPUMemoryUtilization = tc.utilization })
			gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
			eventually(t, "the backend's pool to be reported", func() bool {
				return len(getStatus(t, gwURL).GPUs) == 1 && getStatus(t, gwURL).GPUs[0].ReportedPool > 0
			})
			g := getStatus(t, gwURL).GPUs[0]
			if tc.warn {
				if g.Unusable != g.ReportedPool-g.Configured || g.Unusable <= 0 ||
					!strings.Contains(g.Warning, "--gpu-memory-utilization 0.75") || g.Capacity != g.Configured {
					t.Fatalf("a pool past the ceiling: %+v", g)
				}
			} else if g.Unusable != 0 || g.Warning != "" || g.Capacity != g.ReportedPool || g.Capacity != onlyGPU(gw).Capacity {
				t.Fatalf("a pool at the ceiling: %+v", g)
			}
		})
	}
}

// admission.mode count is the fixed limit a plain proxy gives: at most
// max_concurrency requests per backend, whatever their size.
func TestCountModeLimitsConcurrency(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	gw, gwURL := startGateway(t, baseConfig(url, "admission: {mode: count, max_concurrency: 2, queue: {timeout: 60s}}\n"), Options{})
	var wg sync.WaitGroup
	results := make(chan result, 5)
	for range 5 {
		wg.Go(func() {
			results <- postJSON(gwURL, "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":40}`)
		})
	}
	eventually(t, "two admitted and three queued", func() bool { return onlyGPU(gw).Tickets == 2 && queued(gw) == 3 })
	if st := backend.Stats(); st.Running > 2 {
		t.Fatalf("the backend runs %d", st.Running)
	}
	wg.Wait()
	close(results)
	for r := range results {
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	if p := getStatus(t, gwURL); p.Policy.Mode != "count" || p.GPUs[0].Capacity != 2 {
		t.Fatalf("status: %+v", p)
	}
}

// Under the predicted policy a model starts at its worst case and, once it
// has learned that outputs stop early, admits more than the worst case
// allows — and the backend's pool is never overrun.
func TestPredictedLearnsAndAdmitsMore(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) {
		c.OnOverflow = sim.OverflowOOM
		c.OutputLen = "fixed:24"
		c.TimeScale = 0.1 // requests long enough to overlap on a busy machine
	})
	// Worst case 16 + 4000 tokens = 251 blocks of the budget's 1045: four.
	gw, gwURL := startGateway(t, baseConfig(url, "admission: {reservation: predicted, warmup_samples: 20, queue: {timeout: 120s}}\n"), Options{})
	if p := getStatus(t, gwURL).Policy; p.Epsilon != admission.DefaultEpsilon || p.ResumableEpsilon != admission.DefaultResumableEpsilon || !p.Preemption {
		t.Fatalf("/status policy %+v: want the default epsilons and preemption", p)
	}
	body := `{"model":"llama-3-8b","prompt":"` + words(10) + `","max_tokens":4000,"stream":true}`
	for range 20 {
		if r := postJSON(gwURL, "/v1/completions", body); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	if q := getStatus(t, gwURL).Models[0]; !q.Predicting || q.MedianLength != 24 {
		t.Fatalf("after 20 samples of 24 tokens: %+v", q)
	}
	// One request at a time so far: the pool's peak is one request's size.
	one := backend.Stats().PeakUsedBlocks
	var wg sync.WaitGroup
	for range 24 {
		wg.Go(func() {
			if r := postJSON(gwURL, "/v1/completions", body); r.status != 200 {
				t.Errorf("%d %s", r.status, r.body)
			}
		})
	}
	wg.Wait()
	st := backend.Stats()
	if st.PeakUsedBlocks <= 4*one || st.OOMEvents != 0 || st.PeakUsedBlocks > st.NumGPUBlocks {
		t.Fatalf("peak %d blocks, one request %d: no more than the worst case's four ran at once; backend: %d OOM, pool %d blocks",
			st.PeakUsedBlocks, one, st.OOMEvents, st.NumGPUBlocks)
	}
	t.Logf("peak %d blocks: %d requests' worth at once (the worst case allows 4)", st.PeakUsedBlocks, st.PeakUsedBlocks/one)
	eventually(t, "everything to be released", func() bool { return held(gw) == 0 })
}

// A non-streamed answer teaches the output-length predictor from its usage
// and its one choice's finish_reason; an answer of several choices cannot
// (usage counts them together) and teaches nothing.
func TestNonStreamedAnswersTeachThePredictor(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.OutputLen = "fixed:24" })
	_, gwURL := startGateway(t, baseConfig(url, "admission: {reservation: predicted, warmup_samples: 20}\n"), Options{})
	samples := func() float64 { return getStatus(t, gwURL).Models[0].Samples }
	for _, c := range []struct {
		name  string
		body  string
		learn bool
	}{
		{"one choice", `{"model":"llama-3-8b","prompt":"` + words(10) + `","max_tokens":100}`, true},
		{"chat, one choice", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`, true},
		{"two choices", `{"model":"llama-3-8b","prompt":"` + words(10) + `","max_tokens":100,"n":2}`, false},
		{"cut by max_tokens", `{"model":"llama-3-8b","prompt":"` + words(10) + `","max_tokens":8}`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := samples()
			if r := postJSON(gwURL, pathOf(c.body), c.body); r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if learned := samples() > before; learned != c.learn {
				t.Errorf("learned %v (samples %g → %g), want %v", learned, before, samples(), c.learn)
			}
		})
	}
	for range 20 {
		body := `{"model":"llama-3-8b","prompt":"` + words(10) + `","max_tokens":100}`
		if r := postJSON(gwURL, "/v1/completions", body); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	if q := getStatus(t, gwURL).Models[0]; !q.Predicting || q.MedianLength != 24 {
		t.Fatalf("after 20 more answers of 24 tokens: %+v", q)
	}
}

// A stream's finish teaches the predictor its length, and whether its cap
// cut it: a stream cut by max_tokens says only that the answer would have
// been at least that long, so it does not pull the learned median down.
func TestStreamedFinishesTeachThePredictor(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.OutputLen = "fixed:24" })
	_, gwURL := startGateway(t, baseConfig(url, "admission: {reservation: predicted, warmup_samples: 20}\n"), Options{})
	stream := func(n, maxTokens int) {
		t.Helper()
		for range n {
			if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", maxTokens, true)); r.status != 200 || !strings.Contains(r.body, "[DONE]") {
				t.Fatalf("%d %s", r.status, r.body)
			}
		}
	}
	stream(20, 100) // each stops on its own at 24
	if q := getStatus(t, gwURL).Models[0]; !q.Predicting || q.MedianLength != 24 || q.Samples != 20 {
		t.Fatalf("after 20 streams of 24 tokens: %+v", q)
	}
	stream(40, 8) // each cut at 8
	if q := getStatus(t, gwURL).Models[0]; q.MedianLength != 24 || q.Samples != 60 {
		t.Fatalf("after 40 more cut at 8 tokens: %+v; want the median still 24", q)
	}
}

func pathOf(body string) string {
	if strings.Contains(body, `"messages"`) {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}
