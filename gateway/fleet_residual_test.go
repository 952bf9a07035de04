package gateway

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/admission/fleet/fleettest"
	"github.com/kvgate/kvgate/backends/sim"
)

// A replica that stops calling Redis while its streams run on the GPU —
// paused, or cut off — looks dead to the others, but its streams go on and
// keep their KV blocks. Its lease outlives its TTL as a residual hold, so
// that the other replica, wanting the whole budget, does not lease the
// memory those streams hold: the GPU does not overflow while they finish.
func TestSilentReplicasRunningStreamsAreNotLeasedAgain(t *testing.T) {
	srv := fleettest.StartRedis(t)
	backend, url := startSim(t, func(c *sim.Config) {
		c.TimeScale = 1 // real time: a's streams outlive its lease's TTL many times over
		c.GPUMemoryUtilization = 0.75
		c.OnOverflow = sim.OverflowOOM
		c.DisablePrefixCaching = true // see fleetSim
	})
	// residual_ttl is left at its default: lease_ttl + the request timeout.
	cfg := func(name string) string {
		return baseConfig(url, fmt.Sprintf("admission:\n  queue: {timeout: 60s}\n"+
			"shared_budget: {redis: '%s', replicas: 2, lease_ttl: 2s, chunk: 5%%, replica: %s, lengths_interval: 100ms}\n", srv.URL(), name))
	}
	ga, a := startGateway(t, cfg("a"), Options{})
	gb, b := startGateway(t, cfg("b"), Options{})
	budget := onlyGPU(ga).Capacity

	la := startLoad(a, 4, fleetBody) // about half the budget
	defer la.halt()
	eventually(t, "a to run streams", func() bool { return held(ga) > 0 && lease(ga).Leased > 0 })
	lb := startLoad(b, 16, fleetBody) // twice the budget
	defer lb.halt()
	eventually(t, "b to lease what a leaves", func() bool { return lease(gb).Leased > 0 })

	// a stops calling Redis; its streams run on. Its lessees stop as a
	// paused process's would, and its pool admits nothing new once its
	// lease is past its trust horizon.
	ga.fleet.Abandon()
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
