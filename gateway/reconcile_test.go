package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

// metricsFake is a backend whose /metrics says what the test sets: a pool
// of 1000 blocks of 16 tokens, its usage and running requests.
type metricsFake struct {
	URL     string
	usage   atomic.Uint64 // math.Float64bits
	running atomic.Int64
}

func startMetricsFake(t *testing.T) *metricsFake {
	t.Helper()
	f := &metricsFake{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			return
		}
		fmt.Fprintf(w, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"llama-3-8b\"} %g\n", math.Float64frombits(f.usage.Load()))
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"llama-3-8b\"} %d\n", f.running.Load())
		fmt.Fprint(w, "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\",gpu_memory_utilization=\"0.9\"} 1\n")
	}))
	t.Cleanup(srv.Close)
	f.URL = srv.URL
	return f
}

func (f *metricsFake) set(usage float64, running int64) {
	f.usage.Store(math.Float64bits(usage))
	f.running.Store(running)
}

// A GPU whose backend reports memory in use that nothing admitted there
// accounts for: within the tolerance it shows none; a transient never
// counts; a sustained figure comes off what the GPU admits after the
// sustain window, shows in /status and the metrics and is logged with the
// GPU's name; and it goes once its absence has lasted as long. Each report
// is read by hand, one second apart on the gateway's manual clock.
func TestReconcileUnaccountedMemory(t *testing.T) {
	be := startMetricsFake(t)
	clock := newClock()
	var logs syncbuf.Buffer
	s, gwURL := startGateway(t, fleetConfig("admission: {reconcile: {tolerance: 0.03, sustain: 5s}}\n", be.URL+" 80GiB"),
		Options{Clock: clock, DisableProbes: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	const (
		pool       = 1000 * 16 * 131072 // blocks × tokens × bytes per token of Llama-3-8B
		blockBytes = 16 * 131072
	)
	report := func() { t.Helper(); reportAndTick(t, s, clock) }
	unaccounted := func() int64 { return onlyGPU(s).Unaccounted }
	expect := func(step string, want int64) {
		t.Helper()
		if got := unaccounted(); got != want {
			t.Fatalf("%s: unaccounted %d, want %d", step, got, want)
		}
	}

	be.set(0.03, 2) // 62.9 MB against a tolerance of 3 % + 3 blocks, 69.2 MB
	for range 7 {
		report()
	}
	expect("within the tolerance", 0)

	be.set(0.4, 0) // a transient of 3 s
	for range 3 {
		report()
	}
	be.set(0.01, 0)
	report()
	be.set(0.4, 0)
	for range 3 {
		report()
	}
	be.set(0.01, 0)
	report()
	expect("transient", 0)

	be.set(0.3, 2)
	for range 3 {
		report()
	}
	expect("not sustained yet", 0)
	for range 3 {
		report()
	}
	tol := int64(0.03*float64(pool)) + 3*blockBytes
	want := int64(0.3*float64(pool)) - 3*blockBytes // less the backend's own blocks: its reserved one, one per running request
	expect("sustained", want)
	if free := s.rt.Load().sched.Free(onlyGPU(s).Name); free != pool-want {
		t.Fatalf("Free = %d, want the pool less the unaccounted memory, %d", free, pool-want)
	}
	if !strings.Contains(logs.String(), "no admitted request accounts for") || !strings.Contains(logs.String(), "gpu=gpu0") {
		t.Fatalf("no warning naming the GPU:\n%s", logs.String())
	}
	var st struct {
		GPUs []struct {
			GPU       string         `json:"gpu"`
			Reconcile *reconcileView `json:"reconcile"`
		} `json:"gpus"`
	}
	res, err := httpClient.Get(gwURL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(res.Body).Decode(&st)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if rv := st.GPUs[0].Reconcile; rv == nil || rv.Unaccounted != want || rv.Tolerance != tol || rv.Running != 2 {
		t.Fatalf("/status reconcile: %+v, want %d unaccounted, %d tolerance, 2 running", rv, want, tol)
	}
	if v := gaugeValue(t, gwURL, "kvgate_kv_unaccounted_bytes", "gpu0"); v != float64(want) {
		t.Fatalf("kvgate_kv_unaccounted_bytes = %g, want %d", v, want)
	}

	be.set(0.01, 0) // gone: it counts on until its absence has lasted 5 s
	for range 5 {
		report()
	}
	expect("recovering", want)
	report()
	expect("recovered", 0)
	if !strings.Contains(logs.String(), "unaccounted KV memory is gone") {
		t.Fatalf("no recovery logged:\n%s", logs.String())
	}
}

// gaugeValue reads one gauge of the gateway's /metrics by its gpu label.
func gaugeValue(t *testing.T, gwURL, name, gpu string) float64 {
	t.Helper()
	for _, m := range scrapeGateway(t, gwURL)[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "gpu" && l.GetValue() == gpu {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("%s{gpu=%q} not served", name, gpu)
	return 0
}

// Steady traffic through the gateway alone, on the simulator with its
// probes running: nothing comes off the budget. (A single report may pass
// the tolerance when it is read late, after requests it counted have been
// released — scrape lag, which the sustain window is there for — so the
// largest excess of one report is logged, not asserted.)
func TestReconcileSteadyTrafficShowsNone(t *testing.T) {
	_, simURL := startSim(t, nil)
	// A sustain window of a few reports, shorter than the traffic, so
	// that a lasting excess would count.
	s, gwURL := startGateway(t, baseConfig(simURL, "admission: {reconcile: {sustain: 300ms}}\n"), Options{})
	g := s.rt.Load().gpus["gpu0"]
	eventually(t, "a first reconciliation", func() bool { _, ok := s.rt.Load().reconciled.view(g.id); return ok })
	done := make(chan struct{})
	var worst atomic.Int64 // the largest Observed − Tolerance seen
	worst.Store(math.MinInt64)
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for i := range 48 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				postJSON(gwURL, "/v1/chat/completions", chatBody(words(200+37*i), 64+8*i, i%2 == 0))
			}()
		}
		wg.Wait()
	}()
	for {
		if rv, ok := s.rt.Load().reconciled.view(g.id); ok && rv.Observed-rv.Tolerance > worst.Load() {
			worst.Store(rv.Observed - rv.Tolerance)
		}
		if onlyGPU(s).Unaccounted != 0 {
			t.Fatalf("traffic through the gateway alone took %d bytes off the budget", onlyGPU(s).Unaccounted)
		}
		select {
		case <-done:
			t.Logf("largest excess of one report over the tolerance: %d bytes", worst.Load())
			return
		default:
			time.Sleep(time.Millisecond) // sampling the figures while the traffic runs, not synchronising
		}
	}
}

// Under a shared budget the memory nobody admitted is the whole GPU's: it
// comes off the budget the replica announces in Redis, which every lease
// then fits, and not off this replica's own pool a second time.
func TestReconcileUnderASharedBudget(t *testing.T) {
	be := startMetricsFake(t)
	srv := sharedbudgettest.StartRedis(t)
	clock := newClock()
	s, _ := startGateway(t, replicaConfig(be.URL+" 80GiB", srv.URL(), "a"), Options{Clock: clock, DisableProbes: true})
	const (
		pool       = 1000 * 16 * 131072
		blockBytes = 16 * 131072
	)
	report := func() { t.Helper(); reportAndTick(t, s, clock) }
	be.set(0.3, 0)
	for range 6 {
		report()
	}
	want := int64(0.3*float64(pool)) - blockBytes
	if rv, _ := s.rt.Load().reconciled.view(onlyGPU(s).Name); rv.Unaccounted != want {
		t.Fatalf("unaccounted %d, want %d", rv.Unaccounted, want)
	}
	if st := onlyGPU(s); st.Unaccounted != 0 {
		t.Fatalf("the replica's own pool took %d off as well", st.Unaccounted)
	}
	advanceUntil(t, clock, 100*time.Millisecond, "the announced budget less the unaccounted memory", func() bool {
		return lease(s).Budget == pool-want
	})
}

// reportAndTick has the gateway scrape its only backend and act on the
// report, as its probe would, then moves the clock a scrape interval on.
func reportAndTick(t *testing.T, s *Server, clock interface{ Advance(time.Duration) }) {
	t.Helper()
	rt := s.rt.Load()
	b := rt.upstreams.Backends()[0]
	r, ok := b.Scrape(context.Background())
	if !ok {
		t.Fatalf("scrape: %v", b.LastError())
	}
	s.onKVReport(rt, b, r, ok)
	clock.Advance(time.Second)
}
