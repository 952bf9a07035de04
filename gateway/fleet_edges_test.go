package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/backends/leases"
	"github.com/kvgate/kvgate/backends/leases/leasestest"
	"github.com/kvgate/kvgate/backends/sim"
)

// holeProxy forwards TCP to a server until its hole is opened; from then
// on it reads what either side sends and drops it, as a network that
// blackholes the link without closing it.
type holeProxy struct {
	ln   net.Listener
	hole atomic.Bool
	wg   sync.WaitGroup
	mu   sync.Mutex
	open []net.Conn
}

func startHoleProxy(t *testing.T, target string) *holeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holeProxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.open = append(p.open, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.pipe(s, c)
			go p.pipe(c, s)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.open {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *holeProxy) pipe(dst io.Writer, src io.Reader) {
	defer p.wg.Done()
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.hole.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Issue 26, R3: a replica cut off from Redis kept its lease for go-redis's
// own socket timeout (or forever with timeouts disabled in the URL),
// because go-redis ignored the lessee's call deadline. Each call must end
// at its context's deadline whatever Redis does, while Redis still has not
// answered.
func TestRedisCallEndsAtItsDeadline(t *testing.T) {
	r := leasestest.StartRedis(t)
	req := leases.Request{Replica: "a", Budget: 1 << 30, TTL: 3 * time.Second}
	for _, tc := range []struct {
		name string
		// cut makes Redis stop answering and returns a channel closed once
		// it would answer again (nil: never, within the test).
		cut   func(t *testing.T, p *holeProxy) <-chan struct{}
		retry bool // the cut may have begun after the call was served
	}{
		{"redis under DEBUG SLEEP", func(t *testing.T, _ *holeProxy) <-chan struct{} {
			done := make(chan struct{})
			c := r.Client()
			// Connected already, so that the sleep usually reaches Redis
			// before the call, which goes through the proxy.
			if err := c.Ping(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			go func() {
				defer close(done)
				if err := c.Do(context.Background(), "DEBUG", "SLEEP", "2").Err(); err != nil {
					t.Errorf("DEBUG SLEEP: %v", err)
				}
			}()
			return done
		}, true},
		{"link blackholed", func(t *testing.T, p *holeProxy) <-chan struct{} {
			p.hole.Store(true)
			return nil
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startHoleProxy(t, r.Addr())
			// Socket timeouts off: only the call's own deadline can end it.
			c, err := Parse([]byte(minimal+"shared_budget: {redis: 'redis://"+p.ln.Addr().String()+"/0?read_timeout=-1&write_timeout=-1', replicas: 2}\n"), ".")
			if err != nil {
				t.Fatal(err)
			}
			client := redis.NewClient(c.SharedBudget.redisOpts)
			t.Cleanup(func() { _ = client.Close() })
			store := leases.NewRedis(client, leases.RedisOptions{Prefix: "t26:"})
			if _, err := store.Renew(context.Background(), "gpu0", req); err != nil {
				t.Fatalf("renew before the cut: %v", err)
			}
			for attempt := 0; ; attempt++ {
				answers := tc.cut(t, p)
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				type res struct{ err error }
				got := make(chan res, 1)
				go func() { _, err := store.Renew(ctx, "gpu0", req); got <- res{err} }()
				var err error
				select {
				case g := <-got:
					err = g.err
				case <-time.After(30 * time.Second): // a guard against hanging, not a measurement
					t.Fatal("the call is still waiting on Redis long after its deadline")
				}
				cancel()
				answered := false
				if answers != nil {
					select {
					case <-answers:
						answered = true
					default:
					}
				}
				switch {
				case err == nil && !answered && tc.retry && attempt < 5:
					<-answers // the call ran before the sleep began: again
					continue
				case err == nil:
					t.Fatal("the call waited for Redis to answer, past its deadline")
				case answered:
					t.Fatalf("the call ended only once Redis answered again: %v", err)
				case !errors.Is(err, leases.ErrUnavailable):
					t.Fatalf("err = %v, want ErrUnavailable", err)
				}
				if answers != nil {
					<-answers
				}
				return
			}
		})
	}
}

// Issue 26, R9: /status read the fleet from Redis on its own path and so
// waited on a Redis that did not answer. It answers from what is known: the
// fleet as last listed, with when, while the link to Redis is blackholed.
func TestStatusAnswersFromWhatIsKnown(t *testing.T) {
	r := leasestest.StartRedis(t)
	p := startHoleProxy(t, r.Addr())
	_, url := fleetSim(t)
	_, gw := startGateway(t, replicaConfig(url, "redis://"+p.ln.Addr().String()+"/0", "a"), Options{})
	waitFor(t, "/status to list this replica", func() bool {
		g := statusOf(t, gw).SharedBudget.GPUs[0]
		return len(g.Fleet) == 1 && g.Fleet[0].Self && g.FleetAsOf != ""
	})
	p.hole.Store(true)
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
	r := leasestest.StartRedis(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()
	locked := leasestest.StartRedis(t)
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
			waitFor(t, "the lessee to hear from the store or give up on it", func() bool {
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
	r := leasestest.StartRedis(t)
	_, url := fleetSim(t)
	g, _ := startGateway(t, replicaConfig(url, r.URL(), "a"), Options{})
	waitFor(t, "the lessee to reach Redis", func() bool { return lease(g).Renewals > 0 })
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
	r := leasestest.StartRedis(t)
	_, s0 := startSim(t, func(c *sim.Config) { c.TimeScale = 1; c.GPUMemoryUtilization = 0.75 }) // 500 tokens take ~8 s
	_, s1 := startSim(t, func(c *sim.Config) { c.TimeScale = 1; c.GPUMemoryUtilization = 0.75 })
	extra := fmt.Sprintf("admission:\n  queue: {timeout: 60s}\nshared_budget: {redis: '%s', replicas: 2, lease_ttl: 2s, chunk: 5%%, replica: a, lengths_interval: 100ms}\n", r.URL())
	gw, gwURL := startGateway(t, fleetConfig(extra, s0, s1), Options{})
	c, _ := rawRequest(t, gwURL, "/v1/chat/completions", chatBody("hi", 500, true))
	defer c.Close()
	var removed, kept string
	waitFor(t, "the stream to be admitted", func() bool {
		switch {
		case gpuPool(gw, "gpu0").Held > 0:
			removed, kept = "gpu0", fleetConfig(extra, s1)
			kept = strings.Replace(kept, "name: gpu0", "name: gpu1", 1) // s1 stays gpu1
		case gpuPool(gw, "gpu1").Held > 0:
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
	store := leases.NewRedis(r.Client(), leases.RedisOptions{Prefix: "kvgate:"})
	mine := func() (leases.Holder, bool) {
		fl, err := store.Leases(context.Background(), removed)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range fl.Holders {
			if h.Replica == "a" && h.Bytes > 0 {
				return h, true
			}
		}
		return leases.Holder{}, false
	}
	// Renewed: its time to live goes up again, while the stream runs.
	first, ok := mine()
	if !ok {
		t.Fatalf("the removed GPU's lease was given back while its stream runs")
	}
	waitFor(t, "the removed GPU's lease to be renewed", func() bool {
		h, ok := mine()
		if !ok {
			t.Fatalf("the removed GPU's lease expired while its stream runs (it had %v to live)", first.TTL)
		}
		return h.TTL > first.TTL
	})
	c.Close() // the stream ends: the lease goes back
	waitFor(t, "the removed GPU's lease to go back once its stream ended", func() bool {
		_, ok := mine()
		return !ok
	})
}
