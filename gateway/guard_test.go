package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/backends/sim"
)

// smallOOMSim is an oom simulator with a pool of a few hundred blocks
// (24 GiB at 0.9 less the weights and 6 GiB kept aside), whose answers are
// 8 tokens long unless the prompt says LONG: then 400. A gateway cannot
// read which a request is. It runs at twice a real GPU's pace (a step of
// the batch here takes some 15ms, a block of 16 steps a quarter second),
// not faster: the guard rests on the gateway seeing each stream's tokens
// within a block's worth of the backend's steps, and a loaded test machine
// running the race detector lagged a block at a faster pace.
// mut, when given, changes the simulator further.
func smallOOMSim(t *testing.T, mut ...func(*sim.Config)) (*sim.Server, string) {
	return startSim(t, func(c *sim.Config) {
		c.OnOverflow, c.TimeScale = sim.OverflowOOM, 0.5
		c.Reserve, c.MaxModelLen = 6<<30, 2048
		c.OutputLen, c.OutputLenWhen = "fixed:8", []string{"LONG=fixed:400"}
		for _, m := range mut {
			m(c)
		}
	})
}

// The promise when traffic changes: a model has learned that answers stop
// at 8 tokens, then 30 requests that run to 400 arrive at once. Admitted on
// the old forecast, together they would need several times the pool; the
// gateway stops streams itself, before the backend runs out, so the backend
// never overflows, every other request is answered whole, and the stopped
// ones get an error event with a code of their own (with resume_stopped
// off; see TestGuardResumesStoppedStreams for the default).
func TestGuardStopsStreamsBeforeTheBackendOverflows(t *testing.T) {
	backend, pool, gw, gwURL := taughtShortAnswers(t, "resume_stopped: false")
	const n = 30 // each ~450 tokens at the end, 29 blocks: 870 of a pool of ~330
	var wg sync.WaitGroup
	res := make([]result, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = postJSON(gwURL, "/v1/chat/completions", chatBody("LONG"+words(50), 500, true))
		}()
	}
	wg.Wait()
	whole, stopped := 0, 0
	for i, r := range res {
		switch {
		case r.err != nil || r.status != 200:
			t.Errorf("request %d: %v %d %.300s", i, r.err, r.status, r.body)
		case strings.Contains(r.body, `"code":"kv_guard_stopped"`) && strings.HasSuffix(r.body, "data: [DONE]\n\n"):
			stopped++
		case strings.Contains(r.body, "error"):
			t.Errorf("request %d: an error other than the guard's: %.300s", i, r.body[max(0, len(r.body)-300):])
		case strings.HasSuffix(r.body, "data: [DONE]\n\n"):
			whole++
		default:
			t.Errorf("request %d: a stream that did not end: %.300s", i, r.body[max(0, len(r.body)-300):])
		}
	}
	st := backend.Stats()
	t.Logf("%d answered whole, %d stopped by the guard; the backend's peak %d of %d blocks", whole, stopped, st.PeakUsedBlocks, pool)
	if st.OOMEvents != 0 {
		t.Fatalf("the backend overflowed %d times", st.OOMEvents)
	}
	if stopped == 0 || whole == 0 {
		t.Fatalf("want some stopped and some whole: %d and %d (the test would prove nothing)", stopped, whole)
	}
	as := gw.rt.Load().sched.Stats()
	if as.GuardStops != int64(stopped) || as.Trips[admission.TripGuard]+as.Trips[admission.TripDrift] == 0 || !as.Queues[0].Distrusted {
		t.Errorf("guard stops %d (clients saw %d), trips %v, distrusted %v", as.GuardStops, stopped, as.Trips, as.Queues[0].Distrusted)
	}
	if n := requestsTotal(gw, outcomeShed, reasonGuard); n != float64(stopped) {
		t.Errorf("requests shed by the guard: %g, want %d", n, stopped)
	}
	eventually(t, "every reservation back", func() bool { return held(gw) == 0 })
}

// The same shift with the default, resume_stopped: the streams the guard
// stops are sent again from where they were once they fit, so the backend
// never overflows and every client gets its whole answer: one role chunk,
// no error, [DONE], and usage as one exchange would have counted it.
func TestGuardResumesStoppedStreams(t *testing.T) {
	backend, pool, gw, gwURL := taughtShortAnswers(t, "")
	body := `{"model":"llama-3-8b","messages":[{"role":"user","content":"LONG` + words(50) + `"}],"max_tokens":500,"stream":true,"stream_options":{"include_usage":true}}`
	alone := postJSON(gwURL, "/v1/chat/completions", body) // never stopped: the usage to expect
	want := usageOf(t, alone.body)
	for i, r := range wholeStreams(t, gwURL, body, 30) {
		got := usageOf(t, r.body)
		contents := strings.Count(r.body, `"content":"`) - 1 // the role chunk's empty content
		if got[0] != want[0] || got[1] != contents {
			t.Errorf("request %d: usage prompt %d completion %d; want prompt %d (as alone) and completion %d (the content events)", i, got[0], got[1], want[0], contents)
		}
	}
	st := backend.Stats()
	as := gw.rt.Load().sched.Stats()
	var m dto.Metric
	if err := gw.m.resumed.WithLabelValues("llama-3-8b").Write(&m); err != nil {
		t.Fatal(err)
	}
	resumed := m.GetCounter().GetValue()
	t.Logf("the guard stopped %d streams, %g resumed; the backend's peak %d of %d blocks", as.GuardStops, resumed, st.PeakUsedBlocks, pool)
	if st.OOMEvents != 0 {
		t.Fatalf("the backend overflowed %d times", st.OOMEvents)
	}
	if as.GuardStops == 0 || resumed != float64(as.GuardStops) {
		t.Fatalf("guard stops %d, resumed %g: want some, all resumed (the test would prove nothing)", as.GuardStops, resumed)
	}
	if n := requestsTotal(gw, outcomeShed, reasonGuard); n != 0 {
		t.Errorf("requests shed by the guard: %g, want 0", n)
	}
	eventually(t, "every reservation back", func() bool { return held(gw) == 0 })
}

// A stream the guard stops before its answer begins (the backend still
// computing its prompt) is sent again as it was, once it fits: its client
// gets the whole answer with a 200, not the cut exchange as a backend's
// failure, and the backend is not counted as failing.
func TestGuardResumesAStreamStoppedBeforeItsAnswer(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) { c.TimeScale, c.StepBase, c.OutputLen = 1, 100*time.Millisecond, "fixed:5" })
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	got := make(chan result, 1)
	go func() {
		got <- postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 50, true))
	}()
	eventually(t, "the backend to start", func() bool { return backend.Stats().Running == 1 })
	stopped := 0
	gw.flights.each(func(x *exchange) {
		if x.resume == nil || !x.Resumable() {
			t.Error("a chat stream not kept to be resumed")
		}
		x.StopForMemory()
		stopped++
	})
	if stopped != 1 {
		t.Fatalf("stopped %d requests, want 1", stopped)
	}
	r := <-got
	if r.err != nil || r.status != 200 || strings.Contains(r.body, `"error"`) || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
		t.Fatalf("%v %d %.300s; want the whole stream", r.err, r.status, r.body)
	}
	if n := strings.Count(r.body, `"content":"`) - 1; n != 5 {
		t.Errorf("%d content events, want the 5 tokens once", n)
	}
	var m dto.Metric
	if err := gw.m.resumed.WithLabelValues("llama-3-8b").Write(&m); err != nil {
		t.Fatal(err)
	}
	if v := m.GetCounter().GetValue(); v != 1 {
		t.Errorf("resumed %g, want 1", v)
	}
	if n := requestsTotal(gw, outcomeFailed, "upstream_error"); n != 0 {
		t.Errorf("requests failed upstream: %g, want 0", n)
	}
	eventually(t, "every reservation back", func() bool { return held(gw) == 0 })
}

// taughtShortAnswers starts the small oom simulator and a gateway under
// predicted reservations (with the admission keys in extra) that has
// learned answers are 8 tokens long; pool is the backend's blocks. Its
// abort_hold is the default's second: the simulator, at a fifth of real
// time, frees a cut stream's blocks at its next step, which on a loaded
// machine comes well after 50ms, and what is admitted before then would
// land in blocks it still holds.
func taughtShortAnswers(t *testing.T, extra string, mut ...func(*sim.Config)) (backend *sim.Server, pool int64, gw *Server, gwURL string) {
	t.Helper()
	return taughtShortAnswersOver(t, "", extra, mut...)
}

// taughtShortAnswersOver is taughtShortAnswers with more keys of the
// backend's config (YAML lines indented as its own: "    key: value").
func taughtShortAnswersOver(t *testing.T, backendKeys, extra string, mut ...func(*sim.Config)) (backend *sim.Server, pool int64, gw *Server, gwURL string) {
	t.Helper()
	backend, url := smallOOMSim(t, mut...)
	pool = backend.Stats().NumGPUBlocks
	if backendKeys != "" {
		url += " 24GiB\n" + backendKeys
	}
	gw, gwURL = startGateway(t, baseConfig(url, `admission:
  reservation: predicted
  ceiling: 0.9
  warmup_samples: 10
  queue: {timeout: 60s}
  `+extra+`
`), Options{})
	eventually(t, "the budget to follow the backend's pool", func() bool {
		return onlyGPU(gw).Capacity == pool*2<<20
	})
	for range 15 {
		if r := postJSON(gwURL, "/v1/chat/completions", chatBody(words(50), 500, true)); r.status != 200 || !strings.Contains(r.body, "[DONE]") {
			t.Fatalf("short request: %d %.200s", r.status, r.body)
		}
	}
	return backend, pool, gw, gwURL
}

// usageOf is the prompt and completion tokens of a stream's usage chunk.
func usageOf(t *testing.T, stream string) [2]int {
	t.Helper()
	for _, line := range strings.Split(stream, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || !strings.Contains(data, `"usage":{`) {
			continue
		}
		var ev struct {
			Usage struct {
				Prompt     int `json:"prompt_tokens"`
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
			Choices []any `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("usage chunk %s: %v", data, err)
		}
		if len(ev.Choices) == 0 {
			return [2]int{ev.Usage.Prompt, ev.Usage.Completion}
		}
	}
	t.Fatalf("no usage chunk in ...%s", stream[max(0, len(stream)-300):])
	return [2]int{}
}

// A client that hangs up mid-stream leaves its reservation held for
// admission.abort_hold, measured on the gateway's clock: the backend holds
// the request's blocks until it notices the abort.
func TestHangUpHoldsTheBlocksUntilTheBackendLetsGo(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	clock := admissiontest.NewClock(time.Unix(1e9, 0))
	gw, gwURL := startGateway(t, baseConfig(url, "admission:\n  abort_hold: 2s\n"), Options{Clock: clock})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", gwURL+"/v1/chat/completions", strings.NewReader(chatBody(words(50), 2000, true)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if held(gw) == 0 {
		t.Fatal("nothing held while streaming")
	}
	cancel()
	resp.Body.Close()
	eventually(t, "the gateway to see the hang-up", func() bool {
		return requestsTotal(gw, outcomeCanceled, "client_disconnect") == 1
	})
	if h := held(gw); h == 0 {
		t.Fatal("the reservation went back the moment the client left")
	}
	clock.Advance(2*time.Second - time.Nanosecond)
	if h := held(gw); h == 0 {
		t.Fatal("the reservation went back before abort_hold")
	}
	clock.Advance(time.Nanosecond)
	if h := held(gw); h != 0 {
		t.Fatalf("held %d after abort_hold", h)
	}
}

// Fields that set the output's length size the reservation: a request with
// ignore_eos or min_tokens is held at its worst case even once the model's
// answers are known to stop early.
func TestPinnedLengthsReservedAtWorstCase(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1; c.OutputLen = "fixed:4" })
	gw, gwURL := startGateway(t, baseConfig(url, "admission:\n  reservation: predicted\n  warmup_samples: 5\n"), Options{})
	for range 6 {
		if r := postJSON(gwURL, "/v1/chat/completions", chatBody(words(20), 1000, true)); r.status != 200 {
			t.Fatalf("teaching: %d %s", r.status, r.body)
		}
	}
	for _, tc := range []struct {
		name  string
		extra string
		worst bool
	}{
		{"plain", ``, false},
		{"ignore_eos", `,"ignore_eos":true`, true},
		{"min_tokens", `,"min_tokens":600`, true},
		{"min_tokens 0", `,"min_tokens":0`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := strings.TrimSuffix(chatBody(words(20), 1000, true), "}") + tc.extra + "}"
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", gwURL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := httpClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			p := onlyGPU(gw)
			if got := p.Committed == p.Held; got != tc.worst {
				t.Fatalf("committed %d, held (worst case) %d: at its worst case %v, want %v", p.Committed, p.Held, got, tc.worst)
			}
		})
		eventually(t, "the request to end", func() bool { return held(gw) == 0 })
	}
}

// wholeStreams sends body as n chat streams at once and fails t unless
// every answer is whole: a 200 without an error event, one role chunk, one
// finish_reason, and [DONE] last.
func wholeStreams(t *testing.T, gwURL, body string, n int) []result {
	t.Helper()
	var wg sync.WaitGroup
	res := make([]result, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = postJSON(gwURL, "/v1/chat/completions", body)
		}()
	}
	wg.Wait()
	for i, r := range res {
		if r.err != nil || r.status != 200 || strings.Contains(r.body, `"error"`) || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
			t.Fatalf("request %d: %v %d ...%s", i, r.err, r.status, r.body[max(0, len(r.body)-300):])
		}
		if roles, finishes := strings.Count(r.body, `"role":"assistant"`), strings.Count(r.body, `"finish_reason":"`); roles != 1 || finishes != 1 {
			t.Errorf("request %d: %d role chunks and %d finishes, want one of each", i, roles, finishes)
		}
	}
	return res
}
