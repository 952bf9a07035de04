package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/sharedbudget"
	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
	"github.com/kvgate/kvgate/backends/sim"
)

// Issue 26, R9: /status read the fleet from Redis on its own path and so
// waited on a Redis that did not answer. It answers from what is known: the
// fleet as last listed, with when, while the link to Redis is blackholed.
func TestStatusAnswersFromWhatIsKnown(t *testing.T) {
	r := sharedbudgettest.StartRedis(t)
	p := sharedbudgettest.StartHoleProxy(t, r.Addr())
	_, url := fleetSim(t)
	_, gw := startGateway(t, replicaConfig(url, "redis://"+p.Addr()+"/0", "a"), Options{})
	eventually(t, "/status to list this replica", func() bool {
		g := statusOf(t, gw).SharedBudget.GPUs[0]
		return len(g.Fleet) == 1 && g.Fleet[0].Self && g.FleetAsOf != ""
	})
	p.Cut()
	for range 3 {
		g := statusOf(t, gw).SharedBudget.GPUs[0]
		if len(g.Fleet) != 1 || !g.Fleet[0].Self || g.FleetAsOf == "" {
			t.Fatalf("/status with Redis cut off does not show the fleet as last listed: %+v", g)
		}
	}
}

// Issue 26, R6: a replica that never reached Redis (a wrong password, a
// wrong address) has no capacity, yet answered /readyz 200 and so drew
// traffic it could only queue. It is not ready while no GPU has capacity it
// can use; an idle replica that reaches Redis is ready though it holds no
// lease yet.
func TestReadyOnlyWithUsableCapacity(t *testing.T) {
	r := sharedbudgettest.StartRedis(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()
	locked := sharedbudgettest.StartRedis(t)
	if err := locked.Client().ConfigSet(context.Background(), "requirepass", "right").Err(); err != nil {
		t.Fatal(err)
	}
	_, url := fleetSim(t)
	for _, tc := range []struct {
		name, redis string
		ready       bool
	}{
		{"reachable, idle", r.URL(), true},
		{"wrong password", "redis://:wrong@" + locked.Addr() + "/0", false},
		{"nothing listening", "redis://" + refused + "/0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, gw := startGateway(t, replicaConfig(url, tc.redis, "a"), Options{})
			eventually(t, "the lessee to hear from the store or give up on it", func() bool {
				st := lease(g)
				return st.Renewals > 0 || st.Fallback
			})
			resp, err := http.Get(gw + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := map[bool]int{true: 200, false: 503}[tc.ready]; resp.StatusCode != want {
				t.Fatalf("/readyz %d, want %d: %s (lease %+v)", resp.StatusCode, want, b, lease(g))
			}
			if !tc.ready {
				if e := decodeError(t, string(b)); e.Error.Code == nil || *e.Error.Code != "no_capacity" {
					t.Errorf("/readyz: %s", b)
				}
			}
		})
	}
}

// Issue 26, R3, end to end: a replica whose Redis stops answering falls to
// its static share once its lease is no longer trusted (TTL − TTL/3 after
// the last renewal was sent), while Redis is still silent — not when go-redis
// gives up on the socket, nor when Redis answers again.
func TestCutOffReplicaFallsBackWhileRedisIsSilent(t *testing.T) {
	r := sharedbudgettest.StartRedis(t)
	_, url := fleetSim(t)
	g, _ := startGateway(t, replicaConfig(url, r.URL(), "a"), Options{})
	eventually(t, "the lessee to reach Redis", func() bool { return lease(g).Renewals > 0 })
	c := r.Client()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	silent := make(chan struct{})
	go func() {
		defer close(silent)
		// Three times the lease_ttl's trust (2s − 2s/3) after any renewal.
		if err := c.Do(context.Background(), "DEBUG", "SLEEP", "4").Err(); err != nil {
			t.Errorf("DEBUG SLEEP: %v", err)
		}
	}()
	fellBack := false // before Redis answered again
	for !fellBack {
		select {
		case <-silent:
			t.Fatalf("the replica kept trusting its lease until Redis answered again: %+v", lease(g))
		default:
			fellBack = lease(g).Fallback
			time.Sleep(10 * time.Millisecond) // polling a state, not timing it
		}
	}
	<-silent
}

// Issue 26, R4, shared budget: a GPU a reload removes may still run
// requests the replica admitted there. Its lease must cover them until they
// end — renewed, not given back nor left to expire, or another replica
// would lease the memory they use — and go back once they have.
func TestRemovedGPUKeepsItsLeaseWhileItsRequestsRun(t *testing.T) {
	r := sharedbudgettest.StartRedis(t)
	_, s0 := startSim(t, func(c *sim.Config) { c.TimeScale = 1; c.GPUMemoryUtilization = 0.75 }) // 500 tokens take ~8 s
	_, s1 := startSim(t, func(c *sim.Config) { c.TimeScale = 1; c.GPUMemoryUtilization = 0.75 })
	extra := fmt.Sprintf("admission:\n  queue: {timeout: 60s}\nshared_budget: {redis: '%s', replicas: 2, lease_ttl: 2s, chunk: 5%%, replica: a, lengths_interval: 100ms}\n", r.URL())
	gw, gwURL := startGateway(t, fleetConfig(extra, s0, s1), Options{})
	c, _ := rawRequest(t, gwURL, "/v1/chat/completions", chatBody("hi", 500, true))
	defer c.Close()
	var removed, kept string
	eventually(t, "the stream to be admitted", func() bool {
		switch {
		case gpuStats(gw, "gpu0").Held > 0:
			removed, kept = "gpu0", fleetConfig(extra, s1)
			kept = strings.Replace(kept, "name: gpu0", "name: gpu1", 1) // s1 stays gpu1
		case gpuStats(gw, "gpu1").Held > 0:
			removed, kept = "gpu1", fleetConfig(extra, s0)
		}
		return removed != ""
	})
	cfg, err := Parse([]byte(kept), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	store := sharedbudget.NewRedis(r.Client(), sharedbudget.RedisOptions{Prefix: "kvgate:"})
	mine := func() (sharedbudget.Holder, bool) {
		fl, err := store.Leases(context.Background(), removed)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range fl.Holders {
			if h.Replica == "a" && h.Bytes > 0 {
				return h, true
			}
		}
		return sharedbudget.Holder{}, false
	}
	// Renewed: its time to live goes up again, while the stream runs.
	first, ok := mine()
	if !ok {
		t.Fatalf("the removed GPU's lease was given back while its stream runs")
	}
	eventually(t, "the removed GPU's lease to be renewed", func() bool {
		h, ok := mine()
		if !ok {
			t.Fatalf("the removed GPU's lease expired while its stream runs (it had %v to live)", first.TTL)
		}
		return h.TTL > first.TTL
	})
	c.Close() // the stream ends: the lease goes back
	eventually(t, "the removed GPU's lease to go back once its stream ended", func() bool {
		_, ok := mine()
		return !ok
	})
}
