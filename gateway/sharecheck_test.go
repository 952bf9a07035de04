package gateway

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

// The window of shareCheck: nothing is refuted before shareCheckBlocks
// shared blocks are counted, hits covering half their tokens keep sharing
// on, a shortfall refutes it, and a counter that goes back starts over.
func TestShareCheckWindow(t *testing.T) {
	type step struct {
		blocks, hits float64
		ok           bool
		refuted      bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		// Each report's hits answer for the blocks counted at the report before.
		{"hits cover the shared blocks", []step{{0, 0, true, false}, {20, 0, true, false}, {40, 320, true, false}, {80, 640, true, false}, {80, 1280, true, false}}},
		{"hits from elsewhere only add", []step{{0, 1000, true, false}, {40, 1000, true, false}, {40, 9000, true, false}}},
		{"a hit that comes a report late is in time", []step{{0, 0, true, false}, {49, 0, true, false}, {49, 784, true, false}}},
		{"no hits refute", []step{{0, 0, true, false}, {31, 0, true, false}, {32, 0, true, false}, {32, 0, true, true}}},
		{"half the tokens is enough", []step{{0, 0, true, false}, {32, 0, true, false}, {64, 256, true, false}, {96, 256, true, false}, {96, 511, true, true}}},
		{"hits that come before the next window count in this one", []step{{0, 0, true, false}, {40, 0, true, false}, {80, 1280, true, false}, {80, 1280, true, false}, {120, 1280, true, false}, {120, 1920, true, false}}},
		{"no counters: nothing to compare", []step{{0, 0, false, false}, {64, 0, false, false}, {64, 0, false, false}}},
		{"a restarted backend starts a new window", []step{{0, 5000, true, false}, {20, 0, true, false}, {52, 0, true, false}, {52, 0, true, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c shareCheck
			for i, s := range tc.steps {
				if got, counted, found := c.observe(s.blocks, s.hits, 16, s.ok); got != s.refuted {
					t.Fatalf("step %d (%+v): refuted %v (counted %g, found %g), want %v", i, s, got, counted, found, s.refuted)
				}
			}
		})
	}
}

// prime sends two requests with one prompt through the gateway and waits
// for a report of the backend that counts their prefix-cache look-ups.
func prime(t *testing.T, s *Server, gw, prompt string) {
	t.Helper()
	for range 2 {
		if r := postJSON(gw, "/v1/chat/completions", chatBody(prompt, 2, false)); r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	b := s.rt.Load().gpus["gpu0"].backends[0]
	sent := s.opt.Clock.Now()
	eventually(t, "a report after the requests", func() bool {
		kv, ok := b.KV()
		return ok && kv.At.After(sent)
	})
	eventually(t, "that report read", func() bool { // the next one is read after it
		kv, _ := b.KV()
		return kv.At.After(sent.Add(50 * time.Millisecond))
	})
}

// A backend that reports no enable_prefix_caching label shares by its
// hits: with hits at the model's block size the GPU counts a shared prompt
// once; with hits at zero (its cache off) nothing is counted shared.
func TestSharingFromHits(t *testing.T) {
	for _, shares := range []bool{true, false} {
		t.Run(map[bool]string{true: "hits", false: "no hits"}[shares], func(t *testing.T) {
			_, url := startSim(t, func(c *sim.Config) {
				c.TimeScale, c.HidePrefixCachingLabel, c.DisablePrefixCaching = 1, true, !shares
			})
			s, gw := startGateway(t, baseConfig(url, ""), Options{})
			g := s.rt.Load().gpus["gpu0"]
			eventually(t, "the backend's first report", func() bool { _, _, ok := g.reported(); return ok })
			if g.sharing.Load() {
				t.Fatal("sharing before any hit")
			}
			prompt := words(800)
			prime(t, s, gw, prompt)
			if shares {
				eventually(t, "sharing from the hits", func() bool { return g.sharing.Load() })
			} else if g.sharing.Load() {
				t.Fatal("sharing with hits at zero")
			}
			openStream(t, gw, chatBody(prompt, 2000, true))
			openStream(t, gw, chatBody(prompt, 2000, true))
			st := gpuStats(s, "gpu0")
			if shares != (st.SharedSaved > 0) {
				t.Fatalf("shared saved %d with the backend sharing %v", st.SharedSaved, shares)
			}
		})
	}
}

// prefix_caching: on asserts sharing without any report of it; when the
// backend's hits then show it did not share what the gateway counted, the
// GPU stops sharing and says so.
func TestSharingOnIsRefutedByHits(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale, c.DisablePrefixCaching = 1, true })
	cfg := strings.Replace(baseConfig(url, ""), "    metrics: {interval: 50ms}\n", "    metrics: {interval: 50ms}\n    prefix_caching: on\n", 1)
	var logs syncbuf.Buffer
	s, gw := startGateway(t, cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	g := s.rt.Load().gpus["gpu0"]
	eventually(t, "sharing on the operator's word", func() bool { return g.sharing.Load() })
	prompt := words(800) // 50 full blocks: the second holder shares 49 of them
	openStream(t, gw, chatBody(prompt, 2000, true))
	openStream(t, gw, chatBody(prompt, 2000, true))
	if st := gpuStats(s, "gpu0"); st.SharedBlocks < shareCheckBlocks {
		t.Fatalf("%d blocks counted shared, want at least %d", st.SharedBlocks, shareCheckBlocks)
	}
	eventually(t, "sharing refuted by the backend's hits", func() bool { return g.refuted.Load() && !g.sharing.Load() })
	if !strings.Contains(logs.String(), "did not share the prompt blocks") || !strings.Contains(logs.String(), "gpu=gpu0") {
		t.Fatalf("no warning naming the GPU:\n%s", logs.String())
	}
	before := gpuStats(s, "gpu0").SharedBlocks
	openStream(t, gw, chatBody(prompt, 2000, true))
	if st := gpuStats(s, "gpu0"); st.SharedBlocks != before {
		t.Fatalf("after the refutation %d more blocks were counted shared", st.SharedBlocks-before)
	}
}
