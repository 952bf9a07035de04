package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/admission/sharedbudget"
	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/internal/metricdoc"
)

// The shared budget's configuration, through the gateway's: its defaults
// are filled, and every mistake is named by its path in the file (never
// echoing a Redis password). Package fleet tests the section on its own.
func TestSharedBudgetConfig(t *testing.T) {
	c, err := Parse([]byte(minimal+"shared_budget: {redis: 'redis://127.0.0.1:6379/0', replicas: 3}\n"), ".")
	if err != nil {
		t.Fatal(err)
	}
	sb := c.SharedBudget
	if sb.LeaseTTL.D != 3*time.Second || sb.KeyPrefix != "kvgate:" || sb.LengthsInterval.D != 2*time.Second ||
		sb.Chunk.String() != "2%" || sb.Chunk.Of(1000) != 20 || !strings.Contains(sb.Replica, "-") {
		t.Errorf("defaults: %+v (chunk %s)", sb, sb.Chunk)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"no redis", "shared_budget: {replicas: 2}", "shared_budget.redis: required"},
		{"bad redis url", "shared_budget: {redis: 'http://user:hunter2@h:1', replicas: 2}", "shared_budget.redis: http://***@h:1 is not"},
		{"no replicas", "shared_budget: {redis: 'redis://h:1/0'}", "shared_budget.replicas: required"},
		{"ttl too short", "shared_budget: {redis: 'redis://h:1/0', replicas: 2, lease_ttl: 10ms}", "shared_budget.lease_ttl: 10ms is below 100ms"},
		{"ttl not a duration", "shared_budget: {redis: 'redis://h:1/0', replicas: 2, lease_ttl: soon}", "shared_budget.lease_ttl: invalid duration"},
		{"chunk percent", "shared_budget: {redis: 'redis://h:1/0', replicas: 2, chunk: '150%'}", "shared_budget.chunk: \"150%\": a percentage must be in"},
		{"chunk size", "shared_budget: {redis: 'redis://h:1/0', replicas: 2, chunk: lots}", "shared_budget.chunk: invalid memory size"},
		{"chunk zero", "shared_budget: {redis: 'redis://h:1/0', replicas: 2, chunk: '0'}", "shared_budget.chunk: \"0\": must be more than 0 bytes"},
		{"replica name", "shared_budget: {redis: 'redis://h:1/0', replicas: 2, replica: 'a b'}", "shared_budget.replica"},
		{"lengths interval", "shared_budget: {redis: 'redis://h:1/0', replicas: 2, lengths_interval: 1ms}", "shared_budget.lengths_interval"},
		{"unknown key", "shared_budget: {redis: 'redis://h:1/0', replicas: 2, ttl: 3s}", "shared_budget.ttl: unknown key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(minimal+tc.yaml+"\n"), ".")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

// fleetSim is a simulated vLLM allocating its KV pool at the gateway's
// ceiling (so the pool is the budget: 1045 blocks), failing everything with
// CUDA out of memory when over-admitted.
func fleetSim(t *testing.T) (*sim.Server, string) {
	return startSim(t, func(c *sim.Config) {
		c.GPUMemoryUtilization = 0.75
		c.OnOverflow = sim.OverflowOOM
		// Every request sends the same prompt: with the prefix cache the
		// backend would hold it once, and two replicas that each count it
		// whole could not overflow it however much they admitted.
		c.DisablePrefixCaching = true
	})
}

// replicaConfig is a gateway in front of url; with redisURL it is replica
// name of a fleet of two. The TTL is shorter than the default to keep the
// tests short, and long enough that a replica stalled by a busy machine
// does not lose its lease. A replica these tests kill has its requests
// end with it (crash), so its lease need not outlive its TTL.
func replicaConfig(url, redisURL, name string) string {
	extra := "admission:\n  queue: {timeout: 60s}\n"
	if redisURL != "" {
		extra += fmt.Sprintf("shared_budget: {redis: '%s', replicas: 2, lease_ttl: 2s, residual_ttl: 2s, chunk: 5%%, replica: %s, lengths_interval: 100ms}\n", redisURL, name)
	}
	return baseConfig(url, extra)
}

// loadGen keeps clients requests in flight at url until stopped; a stop
// cancels the requests in flight, as clients that hang up.
type loadGen struct {
	ok, shed, failed, oom atomic.Int64
	stop                  context.CancelFunc
	wg                    sync.WaitGroup
}

func startLoad(url string, clients int, body string) *loadGen {
	ctx, cancel := context.WithCancel(context.Background())
	g := &loadGen{stop: cancel}
	for range clients {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := httpClient.Do(req)
				if err != nil {
					continue // a hang-up of ours, or the replica crashed under us
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case strings.Contains(string(b), "CUDA out of memory"):
					g.oom.Add(1)
				case resp.StatusCode == 200:
					g.ok.Add(1)
				case resp.StatusCode == 429:
					g.shed.Add(1)
				default:
					g.failed.Add(1)
				}
			}
		}()
	}
	return g
}

func (g *loadGen) halt() {
	g.stop()
	g.wg.Wait()
}

// fleetBody is ~1000 prompt and 1000 output tokens: 126 blocks, so the
// budget of 1045 holds 8 at once.
var fleetBody = chatBody(words(1000), 1000, true)

// crash stops s the way kill -9 does, as far as anyone else can tell: its
// lessees stop renewing and give nothing back, and everything it was
// serving is cut off (the backend sees the connections close). The test
// sends it nothing more.
func (s *Server) crash() {
	s.shared.Abandon()
	s.endRequests()
}

// lease is s's lease on its only GPU.
func lease(s *Server) sharedbudget.Stats { return s.shared.Leases()[0].Stats }

// leaseOn is s's lease on gpu; ok is false without a lessee there.
func leaseOn(s *Server, gpu string) (st sharedbudget.Stats, ok bool) {
	for _, ls := range s.shared.Leases() {
		if ls.GPU == gpu {
			return ls.Stats, true
		}
	}
	return sharedbudget.Stats{}, false
}

// Two gateways in front of one GPU each admit its whole budget on their
// own, and overflow it together; sharing the budget through Redis they
// never bind more than it holds. Then one is killed while holding leases:
// the other takes its capacity once the TTL has passed.
func TestTwoGatewaysShareOneBudget(t *testing.T) {
	t.Run("apart they overflow", func(t *testing.T) {
		backend, url := fleetSim(t)
		_, a := startGateway(t, replicaConfig(url, "", ""), Options{})
		_, b := startGateway(t, replicaConfig(url, "", ""), Options{})
		la, lb := startLoad(a, 16, fleetBody), startLoad(b, 16, fleetBody)
		eventually(t, "an overflow", func() bool { return backend.Stats().OOMEvents > 0 })
		la.halt()
		lb.halt()
		t.Logf("without a shared budget: %d OOM events, peak %d of %d blocks", backend.Stats().OOMEvents, backend.Stats().PeakUsedBlocks, backend.Stats().NumGPUBlocks)
	})

	t.Run("shared they fit, and a killed replica's capacity comes back", func(t *testing.T) {
		srv := sharedbudgettest.StartRedis(t)
		backend, url := fleetSim(t)
		ga, a := startGateway(t, replicaConfig(url, srv.URL(), "a"), Options{})
		gb, b := startGateway(t, replicaConfig(url, srv.URL(), "b"), Options{})
		la, lb := startLoad(a, 8, fleetBody), startLoad(b, 8, fleetBody)
		var served int64
		// Each would take the whole budget alone; sharing, they converge on
		// fair halves, so both serve.
		eventually(t, "both replicas to serve 24 requests", func() bool {
			served = la.ok.Load() + lb.ok.Load()
			return la.ok.Load() >= 24 && lb.ok.Load() >= 24
		})
		budget := onlyGPU(ga).Capacity
		chunk := ga.rt.Load().cfg.SharedBudget.Chunk.Of(budget)
		// Whoever leased first, both end up with half: the fair level moves
		// the lease of the one above it to the one below. Give or take two
		// chunks: the level is rounded up to whole chunks, and a lease goes
		// back in whole chunks, so it may stay less than one above it.
		eventually(t, "the leases to converge on fair halves", func() bool {
			la, lb := lease(ga).Leased, lease(gb).Leased
			return la > budget/2-2*chunk && la < budget/2+2*chunk && lb > budget/2-2*chunk && lb < budget/2+2*chunk
		})
		// Two like batches on one GPU: each replica's forecast keeps 1/√2
		// of the safety margin, so that together they keep the GPU's.
		eventually(t, "both forecasts to keep 1/√2 of the margin", func() bool {
			return math.Abs(onlyGPU(ga).Margin-1/math.Sqrt2) < 1e-9 && math.Abs(onlyGPU(gb).Margin-1/math.Sqrt2) < 1e-9
		})
		st := backend.Stats()
		if st.OOMEvents != 0 || la.oom.Load()+lb.oom.Load() != 0 {
			t.Fatalf("the backend overflowed behind two replicas sharing its budget: %d OOM events", st.OOMEvents)
		}
		if st.PeakUsedBlocks > st.NumGPUBlocks || st.PeakUsedBlocks*(2<<20) > budget {
			t.Fatalf("peak %d blocks, pool %d, budget %d bytes", st.PeakUsedBlocks, st.NumGPUBlocks, budget)
		}
		t.Logf("shared: %d served, peak %d of %d blocks, 0 OOM; leases a %+v b %+v", served, st.PeakUsedBlocks, st.NumGPUBlocks, lease(ga), lease(gb))

		// Kill a while it holds a lease: its clients go with it.
		held := lease(ga).Leased
		if held == 0 {
			t.Fatal("a holds no lease: the kill would prove nothing")
		}
		bBefore := lease(gb).Leased
		la.halt()
		ga.crash()
		// a's clients come to b: with its own eight, b wants more than the
		// whole budget, so that it leases all a leaves, however its
		// forecast of its own eight streams (some near their end) falls.
		lb2 := startLoad(b, 8, fleetBody)
		took := eventually(t, "b to lease a's part", func() bool {
			l := lease(gb)
			return l.Leased >= budget-chunk && l.Leased > bBefore
		}, func() string {
			held, queued := gb.rt.Load().sched.Demand(onlyGPU(gb).Name)
			return fmt.Sprintf("budget %d, chunk %d; b leased %+v, its demand %d held + %d queued", budget, chunk, lease(gb), held, queued)
		})
		// And b admits into it: more than a budget's worth minus a's
		// lease is bound on b at once.
		eventually(t, "b to bind into a's part", func() bool { return onlyGPU(gb).Committed > budget-held })
		eventually(t, "b's forecast to keep the whole margin again", func() bool { return onlyGPU(gb).Margin == 1 })
		t.Logf("after a was killed holding %d bytes: b leased %d (from %d) after %v (TTL 2s)", held, lease(gb).Leased, bBefore, took.Round(time.Millisecond))
		lb.halt()
		lb2.halt()
		st = backend.Stats()
		if st.OOMEvents != 0 || lb.oom.Load()+lb2.oom.Load() != 0 {
			t.Fatalf("overflow after the kill: %d OOM events", st.OOMEvents)
		}
		if st.PeakUsedBlocks > st.NumGPUBlocks {
			t.Fatalf("peak %d blocks over the pool of %d", st.PeakUsedBlocks, st.NumGPUBlocks)
		}
	})
}

func statusOf(t *testing.T, url string) statusView {
	t.Helper()
	resp, err := http.Get(url + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v statusView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Redis stops under load: both replicas serve on their static shares (and
// say so in /status and the fallback metric) without overflowing the GPU;
// Redis comes back empty: both lease again, as the fleet view shows.
func TestSharedBudgetThroughARedisOutage(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	backend, url := fleetSim(t)
	ga, a := startGateway(t, replicaConfig(url, srv.URL(), "a"), Options{})
	gb, b := startGateway(t, replicaConfig(url, srv.URL(), "b"), Options{})
	la, lb := startLoad(a, 12, fleetBody), startLoad(b, 12, fleetBody)
	defer la.halt()
	defer lb.halt()
	eventually(t, "both replicas to lease", func() bool { return lease(ga).Leased > 0 && lease(gb).Leased > 0 })
	gpu0 := map[string]string{"gpu": "gpu0"}
	if v, ok := metricValue(t, ga, "kvgate_shared_budget_fallback", gpu0); !ok || v != 0 {
		t.Fatalf("fallback metric before the outage: %v (exported %v)", v, ok)
	}
	eventually(t, "/status to list both replicas' leases", func() bool {
		v := statusOf(t, a).SharedBudget
		if v == nil || v.Replica != "a" || len(v.GPUs) != 1 || v.GPUs[0].Fallback {
			t.Fatalf("/status before the outage: %+v", v)
		}
		f := v.GPUs[0].Fleet
		return len(f) == 2 && f[0].Replica == "a" && f[0].Self && f[0].Bytes > 0 && f[1].Replica == "b" && f[1].Bytes > 0
	})

	srv.Stop()
	eventually(t, "both replicas to fall back", func() bool { return lease(ga).Fallback && lease(gb).Fallback })
	share := onlyGPU(ga).Capacity / 2
	for _, g := range []*Server{ga, gb} {
		if l := lease(g); l.Capacity > share || l.Share != share {
			t.Errorf("in the fallback: %+v, want capacity at most the share %d", l, share)
		}
	}
	if v, _ := metricValue(t, ga, "kvgate_shared_budget_fallback", gpu0); v != 1 {
		t.Errorf("fallback metric during the outage: %v, want 1", v)
	}
	sv := statusOf(t, b).SharedBudget
	if g := sv.GPUs[0]; !g.Fallback || g.FleetError == "" || g.LastError == "" {
		t.Errorf("/status during the outage: %+v", g)
	}
	okA, okB := la.ok.Load(), lb.ok.Load()
	eventually(t, "both replicas to serve during the outage", func() bool { return la.ok.Load() > okA+5 && lb.ok.Load() > okB+5 })

	srv.Restart()
	eventually(t, "both replicas to lease again", func() bool {
		return !lease(ga).Fallback && !lease(gb).Fallback && lease(ga).Leased > 0 && lease(gb).Leased > 0
	})
	eventually(t, "the fleet view to list both again", func() bool {
		g := statusOf(t, a).SharedBudget.GPUs[0]
		return len(g.Fleet) == 2 && g.FleetError == ""
	})
	la.halt()
	lb.halt()
	st := backend.Stats()
	if st.OOMEvents != 0 || la.oom.Load()+lb.oom.Load() != 0 || st.PeakUsedBlocks > st.NumGPUBlocks {
		t.Fatalf("through the outage: %d OOM events, peak %d of %d blocks", st.OOMEvents, st.PeakUsedBlocks, st.NumGPUBlocks)
	}
	t.Logf("through the outage: a %d ok, b %d ok, peak %d of %d blocks, 0 OOM", la.ok.Load(), lb.ok.Load(), st.PeakUsedBlocks, st.NumGPUBlocks)
}

// A reload keeps the lessee of a GPU that stays, starts a closed one for a
// GPU it adds and shuts down that of one it removes; a request that finds
// its pool closed wakes the lessee and is admitted as soon as the lease
// comes; Shutdown gives the lease back.
func TestSharedBudgetReloadAndShutdown(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	_, url0 := fleetSim(t)
	_, url1 := fleetSim(t)
	one := replicaConfig(url0, srv.URL(), "a")
	two := strings.Replace(one, "admission:", fmt.Sprintf(`  - name: gpu1
    url: %s
    models: [llama-3-8b]
    gpu_memory: 24GiB
admission:`, url1), 1)
	cfg, err := Parse([]byte(one), ".")
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, Options{Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	url := serveLoopback(t, g.Serve, func(context.Context) error { return nil })
	if st := onlyGPU(g); st.Limit != 0 {
		t.Fatalf("a replica's pool starts at limit %d, want 0 (closed until its lease comes)", st.Limit)
	}
	if r := postJSON(url, "/v1/chat/completions", chatBody("hi", 16, false)); r.status != 200 {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	before, _ := leaseOn(g, "gpu0")
	if before.Leased == 0 || before.Grants == 0 {
		t.Fatalf("the request was served without a lease: %+v", before)
	}
	// kept says gpu0's lessee is the one that served the first request: a
	// new one would start at no grants, and without demand it asks for none.
	kept := func() bool {
		l, ok := leaseOn(g, "gpu0")
		return ok && l.Grants >= before.Grants && l.Renewals >= before.Renewals
	}

	reload := func(y string) {
		t.Helper()
		c, err := Parse([]byte(y), ".")
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Reload(c); err != nil {
			t.Fatal(err)
		}
	}
	reload(two)
	if !kept() {
		t.Fatal("the reload replaced the lessee of a GPU that stays: its lease would start over")
	}
	if _, ok := leaseOn(g, "gpu1"); !ok {
		t.Fatal("no lessee for the GPU the reload added")
	}
	if st, _ := g.sched.GPU("gpu1"); st.Limit != 0 {
		t.Fatalf("the added GPU's pool has limit %d, want 0 until its lease comes", st.Limit)
	}
	if r := postJSON(url, "/v1/chat/completions", chatBody("hi", 16, false)); r.status != 200 {
		t.Fatalf("after the reload: %d %s", r.status, r.body)
	}
	reload(strings.NewReplacer("replica: a", "replica: renamed", "replicas: 2", "replicas: 3").Replace(one)) // shared_budget needs a restart
	if sb := g.rt.Load().cfg.SharedBudget; sb.Replica != "a" || sb.Replicas != 2 || len(g.shared.Leases()) != 1 || !kept() {
		t.Fatalf("after removing gpu1: replica %q of %d, lessees %+v", sb.Replica, sb.Replicas, g.shared.Leases())
	}
	if n, _ := metricValue(t, g, "kvgate_redis_round_trip_seconds", map[string]string{"op": "acquire", "result": "ok"}); n == 0 {
		t.Error("no acquire round trip in the latency histogram")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	store := sharedbudget.NewRedis(srv.Client(), sharedbudget.RedisOptions{Prefix: "kvgate:"})
	for _, gpu := range []string{"gpu0", "gpu1"} {
		f, err := store.Leases(context.Background(), gpu)
		if err != nil {
			t.Fatal(err)
		}
		if f.Total != 0 {
			t.Errorf("%s after Shutdown: %+v, want every lease given back", gpu, f)
		}
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// A replica's own series are the ones docs/METRICS.md lists for it, follow
// the naming rules, and exist at zero from the start for each GPU.
func TestSharedBudgetMetricsMatchDocs(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	_, url := fleetSim(t)
	_, gw := startGateway(t, replicaConfig(url, srv.URL(), "a"), Options{DisableProbes: true})
	rows, err := metricdoc.ParseFile("../docs/METRICS.md", "shared_budget")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, r := range rows {
		documented[r.Name] = true
	}
	fams := scrapeGateway(t, gw)
	for _, d := range metricdoc.Compare(rows, fams, func(name string) bool { return !documented[name] && !isFleetFamily(name) }) {
		t.Error(d)
	}
	own := map[string]*dto.MetricFamily{}
	for name, f := range fams {
		if isFleetFamily(name) {
			own[name] = f
		}
	}
	for _, p := range metricdoc.Lint(own, nil) {
		t.Error(p)
	}
	for name, f := range own {
		if len(f.GetMetric()) == 0 {
			t.Errorf("%s has no series before any request", name)
		}
	}
}

func isFleetFamily(name string) bool {
	return strings.HasPrefix(name, "kvgate_shared_budget_") || strings.HasPrefix(name, "kvgate_redis_")
}
