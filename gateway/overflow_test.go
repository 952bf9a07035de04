package gateway

import (
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/backends/sim"
)

// The product's claim, shown against the same load sent straight to the
// backend: a simulated vLLM that fails everything with CUDA out of memory
// when over-admitted (oom mode, no queue of its own) receives, through the
// gateway, many times the concurrency its KV pool holds, and never
// overflows; every client gets a correct 200 or a 429 with Retry-After; the
// reservations all come back.
//
// The pool (24 GiB at vLLM's 0.9, minus 15 GiB of weights and 1 GiB) holds
// 2888 blocks; the gateway's budget at its 0.75 ceiling is 1045. Each
// request is ~1000 prompt + 1000 output tokens, 126 blocks: the pool fits 22
// at once, the budget 8, and 64 are sent together.
func TestGatewayPreventsOverflow(t *testing.T) {
	const clients = 64
	load := func(url string) []result {
		var wg sync.WaitGroup
		out := make([]result, clients)
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i] = postJSON(url, "/v1/chat/completions", chatBody(words(1000), 1000, i%2 == 0))
			}()
		}
		wg.Wait()
		return out
	}
	oom := func(c *sim.Config) { c.OnOverflow = sim.OverflowOOM }

	t.Run("direct", func(t *testing.T) {
		direct, url := startSim(t, oom)
		res := load(url)
		oomErrors := 0
		for _, r := range res {
			if r.err == nil && strings.Contains(r.body, "CUDA out of memory") {
				oomErrors++
			}
		}
		st := direct.Stats()
		if st.OOMEvents == 0 || oomErrors == 0 {
			t.Fatalf("direct load did not overflow the backend (events %d, CUDA errors %d): the test would prove nothing", st.OOMEvents, oomErrors)
		}
		t.Logf("direct: %d OOM events, %d of %d requests failed with CUDA out of memory", st.OOMEvents, oomErrors, clients)
	})

	t.Run("through gateway", func(t *testing.T) {
		backend, url := startSim(t, oom)
		gw, gwURL := startGateway(t, baseConfig(url, "admission:\n  queue: {timeout: 60s}\n"), Options{})
		res := load(gwURL)
		ok, shed := 0, 0
		for i, r := range res {
			switch {
			case r.err != nil:
				t.Errorf("client %d: %v", i, r.err)
			case r.status == 200:
				if strings.Contains(r.body, "error") || (i%2 == 0 && !strings.Contains(r.body, "[DONE]")) {
					t.Errorf("client %d: 200 with a broken body: %.300s", i, r.body)
				}
				ok++
			case r.status == 429:
				if r.retryAfter == "" {
					t.Errorf("client %d: 429 without Retry-After", i)
				}
				decodeError(t, r.body)
				shed++
			default:
				t.Errorf("client %d: status %d: %.300s", i, r.status, r.body)
			}
		}
		st := backend.Stats()
		if st.OOMEvents != 0 {
			t.Fatalf("the backend overflowed behind the gateway: %d OOM events", st.OOMEvents)
		}
		budgetBlocks := onlyGPU(gw).Capacity / (2 << 20)
		if st.PeakUsedBlocks > budgetBlocks {
			t.Errorf("backend peaked at %d blocks, over the gateway's budget of %d", st.PeakUsedBlocks, budgetBlocks)
		}
		if ok == 0 {
			t.Fatal("nothing was served")
		}
		eventually(t, "reservations to return", func() bool { return held(gw) == 0 })
		t.Logf("through gateway: %d ok, %d shed, peak %d of %d pool blocks (budget %d), 0 OOM events", ok, shed, st.PeakUsedBlocks, st.NumGPUBlocks, budgetBlocks)
	})
}
