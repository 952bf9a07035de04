package loadtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/gateway"
)

// startGateway runs the real gateway in-process in front of backendURL,
// with a budget of exactly 8 of the sim workload's requests and a short
// queue, so that past 8 concurrent requests it queues and then sheds.
func startGateway(t *testing.T, backendURL string) string {
	t.Helper()
	cfg, err := gateway.Parse([]byte(fmt.Sprintf(`listen: 127.0.0.1:0
admission:
  queue: {max_requests: 4, timeout: 2s}
models:
  - name: llama-3-8b
    geometry: {layers: 32, kv_heads: 8, head_dim: 128, dtype: bfloat16}
    weights_bytes: 16060522496
    max_model_len: 8192
backends:
  - name: gpu0
    url: %s
    models: [llama-3-8b]
    kv_budget: %d
    health: {interval: 50ms}
    metrics: {interval: 50ms}
`, backendURL, 8*simBlocksPerRequest*(2<<20))), ".")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(cfg, gateway.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gw.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gw.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

// Through the gateway, the same sweep that overflows an oom sim at 16
// (TestSweepAgainstOOMSimFindsTheStepBefore) never overflows it: past the
// budget the gateway queues and sheds, and the shedding shows as 429s, not
// as failures.
func TestSweepThroughGatewayNeverOverflows(t *testing.T) {
	simURL, s := startSim(t, simConfig(sim.OverflowOOM))
	checkSimGeometry(t, s)
	gwURL := startGateway(t, simURL)
	cfg := fastConfig(t, Target{Name: "gateway", URL: gwURL, MetricsURL: simURL + "/metrics"})
	cfg.Concurrency = []int{4, 8, 16, 32}
	cfg.KeepGoing = true
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	shed := 0
	for _, st := range rep.Steps {
		n := st.Requests
		if n.Overflow+n.WarmupOverflow+n.Server5xx+n.ConnError != 0 {
			t.Errorf("step %g failed through the gateway: %+v %v", st.Level, n, st.Reasons)
		}
		if st.KV != nil && st.KV.OOMEvents != 0 {
			t.Errorf("step %g: %g OOM events", st.Level, st.KV.OOMEvents)
		}
		shed += n.Shed
	}
	if shed == 0 {
		t.Error("no 429 at 32 concurrent requests against a budget of 8 and a queue of 4: the test shows nothing")
	}
	if ev := s.Stats().OOMEvents; ev != 0 {
		t.Fatalf("the sim overflowed behind the gateway: %d events", ev)
	}
	// Past the budget (8 requests) most requests are shed, which may leave
	// too few completions to judge a step, but never an overflow or a 5xx.
	if !rep.HasSafe || rep.Safe < 8 {
		t.Errorf("safe %v %g, want at least 8\n%s", rep.HasSafe, rep.Safe, rep.Answer)
	}
	if ff := rep.FirstFailure; ff != nil {
		for _, r := range ff.Reasons {
			if strings.Contains(r, "overflow") || strings.Contains(r, "5xx") {
				t.Errorf("first failure at %g is a failure of the backend: %v", ff.Level, ff.Reasons)
			}
		}
	}
	t.Logf("%s (%d requests shed with 429)", rep.Answer, shed)
}
