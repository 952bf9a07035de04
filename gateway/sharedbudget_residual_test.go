package gateway

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
	"github.com/kvgate/kvgate/backends/sim"
)

// A replica that stops calling Redis while its streams run on the GPU —
// paused, or cut off — looks dead to the others, but its streams go on and
// keep their KV blocks. Its lease outlives its TTL as a residual hold, so
// that the other replica, wanting the whole budget, does not lease the
// memory those streams hold: the GPU does not overflow while they finish.
func TestSilentReplicasRunningStreamsAreNotLeasedAgain(t *testing.T) {
	rg := startResidualPair(t)
	ga, gb, b, budget, backend, lb := rg.ga, rg.gb, rg.b, rg.budget, rg.backend, rg.lb

	// a stops calling Redis; its streams run on. Its lessees stop as a
	// paused process's would, and its pool admits nothing new once its
	// lease is past its trust horizon.
	ga.shared.Abandon()
	aLeased := lease(ga).Leased // as a's lessee left it
	eventually(t, "b to see a's lease as a residual hold", func() bool { return lease(gb).Residual == aLeased },
		func() string { return fmt.Sprintf("a leased %d; b %+v", aLeased, lease(gb)) })
	// /status lists the fleet as last read, refreshed in the background.
	eventually(t, "b's /status to list a as a residual hold", func() bool {
		g := statusOf(t, b).SharedBudget.GPUs[0]
		for _, h := range g.Fleet {
			if h.Replica == "a" && h.Residual && h.Bytes == aLeased && h.KeepMs > 0 && h.TTLMs == 0 {
				return g.Residual == aLeased
			}
		}
		return false
	}, func() string { return fmt.Sprintf("%+v", statusOf(t, b).SharedBudget.GPUs[0]) })
	// b wants it all but leases only what the residual hold leaves, until
	// a's streams have ended.
	eventually(t, "a's streams to end", func() bool {
		if l := lease(gb).Leased; l > budget-aLeased {
			t.Fatalf("b leased %d with a's %d held as a residual hold of a budget of %d", l, aLeased, budget)
		}
		return held(ga) == 0
	})
	if st := backend.Stats(); st.OOMEvents != 0 || lb.oom.Load() != 0 || st.PeakUsedBlocks > st.NumGPUBlocks {
		t.Fatalf("the GPU overflowed while a was silent: %d OOM events, peak %d of %d blocks", st.OOMEvents, st.PeakUsedBlocks, st.NumGPUBlocks)
	}
	t.Logf("a leased %d of %d when it fell silent; b leased %d meanwhile; peak %d of %d blocks, 0 OOM",
		aLeased, budget, lease(gb).Leased, backend.Stats().PeakUsedBlocks, backend.Stats().NumGPUBlocks)
}

// A replica killed with its streams running: its clients' connections go
// with it and the backend aborts those streams. The other replica reads the
// backend's figures covered by its own requests and ends the residual hold
// at once, long before residual_ttl (here lease_ttl + the request timeout),
// and leases the memory the streams held.
func TestKilledReplicasResidualHoldEndsOnTheBackendsEvidence(t *testing.T) {
	rg := startResidualPair(t)
	ga, gb, budget, backend, la, lb := rg.ga, rg.gb, rg.budget, rg.backend, rg.la, rg.lb

	// a dies: its lessees stop, and its clients' streams end with it (the
	// gateway cancels them upstream, as the backend does when a dead
	// process's connections close).
	ga.shared.Abandon()
	aLeased := lease(ga).Leased
	la.halt()
	eventually(t, "b to end a's residual hold on the backend's figures and lease its part", func() bool {
		st := lease(gb)
		return st.ResidualDrops > 0 && st.Residual == 0 && st.Leased > budget-aLeased
	}, func() string { return fmt.Sprintf("a leased %d of %d; b %+v", aLeased, budget, lease(gb)) })
	if st := backend.Stats(); st.OOMEvents != 0 || lb.oom.Load() != 0 || st.PeakUsedBlocks > st.NumGPUBlocks {
		t.Fatalf("the GPU overflowed: %d OOM events, peak %d of %d blocks", st.OOMEvents, st.PeakUsedBlocks, st.NumGPUBlocks)
	}
}

// residualPair is two replicas, a and b, sharing a simulated GPU that fails
// on overflow, in real time; a runs streams on about half the budget, b
// wants twice the budget and leases what a leaves. residual_ttl is left at
// its default: lease_ttl + the request timeout.
type residualPair struct {
	ga, gb  *Server
	b       string
	budget  int64
	backend *sim.Server
	la, lb  *loadGen
}

func startResidualPair(t *testing.T) residualPair {
	t.Helper()
	srv := sharedbudgettest.StartRedis(t)
	backend, url := startSim(t, func(c *sim.Config) {
		c.TimeScale = 1 // real time: a's streams outlive its lease's TTL many times over
		c.GPUMemoryUtilization = 0.75
		c.OnOverflow = sim.OverflowOOM
		c.DisablePrefixCaching = true // see fleetSim
	})
	cfg := func(name string) string {
		return baseConfig(url, fmt.Sprintf("admission:\n  queue: {timeout: 60s}\n"+
			"shared_budget: {redis: '%s', replicas: 2, lease_ttl: 2s, chunk: 5%%, replica: %s, lengths_interval: 100ms}\n", srv.URL(), name))
	}
	ga, a := startGateway(t, cfg("a"), Options{})
	gb, b := startGateway(t, cfg("b"), Options{})
	rg := residualPair{ga: ga, gb: gb, b: b, budget: onlyGPU(ga).Capacity, backend: backend}
	rg.la = startLoad(a, 4, fleetBody)
	t.Cleanup(rg.la.halt)
	eventually(t, "a to run streams", func() bool { return held(ga) > 0 && lease(ga).Leased > 0 })
	rg.lb = startLoad(b, 16, fleetBody)
	t.Cleanup(rg.lb.halt)
	eventually(t, "b to lease what a leaves", func() bool { return lease(gb).Leased > 0 })
	return rg
}
