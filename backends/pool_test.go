package backends

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
)

type fixedBudget struct{ free atomic.Int64 }

func (f *fixedBudget) Free() int64 { return f.free.Load() }

func budgetOf(free int64) *fixedBudget {
	b := &fixedBudget{}
	b.free.Store(free)
	return b
}

// newClock is a manual clock for circuits, probes and timeouts.
func newClock() *admissiontest.Clock { return admissiontest.NewClock(time.Unix(0, 0)) }

func mustBackend(t *testing.T, name string, models []string, b Budget, clock admission.Clock) *Backend {
	t.Helper()
	be, err := NewBackend(Spec{Name: name, URL: "http://127.0.0.1:1", Models: models, FailThreshold: 2, Cooldown: 5 * time.Second}, b, clock)
	if err != nil {
		t.Fatal(err)
	}
	return be
}

func TestPickMostFreeThenRoundRobin(t *testing.T) {
	c := newClock()
	a := mustBackend(t, "a", []string{"m"}, budgetOf(100), c)
	b := mustBackend(t, "b", []string{"m"}, budgetOf(300), c)
	x := mustBackend(t, "x", []string{"other"}, budgetOf(1000), c)
	p := NewPool([]*Backend{a, b, x})
	for range 4 {
		if got, _ := p.Pick("m", nil); got != b {
			t.Fatalf("picked %s, want b (most free)", got.Name())
		}
	}
	b.budget.(*fixedBudget).free.Store(100) // now equal: alternate
	seen := map[string]int{}
	for range 10 {
		got, err := p.Pick("m", nil)
		if err != nil {
			t.Fatal(err)
		}
		seen[got.Name()]++
	}
	if seen["a"] != 5 || seen["b"] != 5 {
		t.Errorf("ties not shared round-robin: %v", seen)
	}
	if got, _ := p.Pick("m", func(be *Backend) bool { return be == a }); got != b {
		t.Errorf("skip ignored: %v", got.Name())
	}
	if _, err := p.Pick("nope", nil); !errors.Is(err, ErrNoBackend) {
		t.Errorf("unknown model: %v", err)
	}
}

// State stepping, as Caddy's tests do: mark a backend down, it is skipped,
// after the cooldown too (its probes are its trial); a success brings it
// back. One that first-byte timeouts took down is tried again after the
// cooldown, since only an answered request can bring it back.
func TestCircuitSkipsOpenBackend(t *testing.T) {
	c := newClock()
	a := mustBackend(t, "a", []string{"m"}, budgetOf(500), c)
	b := mustBackend(t, "b", []string{"m"}, budgetOf(100), c)
	p := NewPool([]*Backend{a, b})

	if opened := a.ReportFailure(errors.New("boom")); opened {
		t.Fatal("one failure opened the circuit (threshold 2)")
	}
	if got, _ := p.Pick("m", nil); got != a {
		t.Fatal("a should still be picked after one failure")
	}
	if opened := a.ReportFailure(errors.New("boom")); !opened {
		t.Fatal("second failure did not open the circuit")
	}
	if a.State() != StateOpen || a.LastError() != "boom" {
		t.Fatalf("state %s, last error %q", a.State(), a.LastError())
	}
	if got, _ := p.Pick("m", nil); got != b || !p.Serves("m") {
		t.Fatal("open backend was picked, or the model is said unserved")
	}
	b.ReportFailure(nil)
	b.ReportFailure(nil)
	if _, err := p.Pick("m", nil); !errors.Is(err, ErrNoBackend) || p.Ready() || p.Serves("m") {
		t.Fatalf("all open: err %v, ready %v, serves %v", err, p.Ready(), p.Serves("m"))
	}
	c.Advance(5 * time.Second)
	if _, err := p.Pick("m", nil); a.State() != StateOpen || !errors.Is(err, ErrNoBackend) {
		t.Fatalf("after the cooldown a backend that failed is tried before a probe passed: %s, %v", a.State(), err)
	}
	a.ReportSuccess()
	if a.State() != StateClosed || a.LastError() != "" {
		t.Fatalf("after success: %s %q", a.State(), a.LastError())
	}
	if got, _ := p.Pick("m", nil); got != a {
		t.Fatal("a recovered backend was not picked")
	}

	for range 2 {
		a.ReportTimeout(errors.New("first byte timeout"))
	}
	if got, _ := p.Pick("m", nil); a.State() != StateOpen || got == a {
		t.Fatalf("after two timeouts: %s, picked %v", a.State(), got)
	}
	c.Advance(5 * time.Second)
	if got, _ := p.Pick("m", nil); a.State() != StateHalfOpen || got != a {
		t.Fatalf("a backend that timed out not tried after the cooldown: %s", a.State())
	}
	a.ReportTimeout(errors.New("still hangs")) // the trial fails: open for another cooldown
	if a.State() != StateOpen {
		t.Fatalf("failed trial: %s", a.State())
	}
}

func TestProbeAgainstRealServer(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	addr, _ := serve(t, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/health":
			if !healthy.Load() {
				ctx.SetStatusCode(503)
			}
		case "/metrics":
			fmt.Fprint(ctx, "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\",gpu_memory_utilization=\"0.9\"} 1\n")
		case "/tokenize":
			if !strings.Contains(string(ctx.PostBody()), `"prompt"`) {
				ctx.SetStatusCode(400)
				return
			}
			fmt.Fprint(ctx, `{"count":42,"max_model_len":8192,"tokens":[]}`)
		}
	})
	c := newClock()
	be, err := NewBackend(Spec{Name: "s", URL: "http://" + addr, Models: []string{"m"}, FailThreshold: 1}, budgetOf(1), c)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := be.Probe(context.Background())
	if !ok || r.Usage != 0.5 || r.NumGPUBlocks != 100 || be.State() != StateClosed {
		t.Fatalf("probe: %+v %v %s", r, ok, be.State())
	}
	if kv, ok := be.KV(); !ok || kv != r {
		t.Fatalf("KV() = %+v", kv)
	}
	n, err := be.Tokenize(context.Background(), []byte(`{"model":"m","prompt":"hi"}`))
	if err != nil || n != 42 {
		t.Fatalf("tokenize: %d %v", n, err)
	}
	var se *StatusError
	if _, err := be.Tokenize(context.Background(), []byte(`{}`)); !errors.As(err, &se) || se.Status != 400 {
		t.Fatalf("tokenize error: %v", err)
	}
	healthy.Store(false)
	be.Probe(context.Background())
	if be.State() != StateOpen {
		t.Fatalf("503 health did not open the circuit: %s", be.State())
	}
}

func TestNewBackendValidation(t *testing.T) {
	tests := []struct {
		spec Spec
		want string
	}{
		{Spec{URL: "http://a:1", Models: []string{"m"}}, "name is required"},
		{Spec{Name: "a", URL: "a:1", Models: []string{"m"}}, "want http://host:port"},
		{Spec{Name: "a", URL: "ftp://a:1", Models: []string{"m"}}, "want http://host:port or https://"},
		{Spec{Name: "a", URL: "http://a:1", Models: []string{"m"}, TLS: &TLSSpec{}}, "not https://"},
		{Spec{Name: "a", URL: "https://a:1", Models: []string{"m"}, TLS: &TLSSpec{CAPEM: PEM("junk")}}, "tls: ca_file: no PEM certificate"},
		{Spec{Name: "a", URL: "https://a:1", Models: []string{"m"}, TLS: &TLSSpec{CertPEM: PEM("x")}}, "give both or neither"},
		{Spec{Name: "a", URL: "https://a:1", Models: []string{"m"}, TLS: &TLSSpec{CertPEM: PEM("x"), KeyPEM: PEM("y")}}, "tls: cert_file, key_file"},
		{Spec{Name: "a", URL: "http://a:1/v1", Models: []string{"m"}}, "without a path"},
		{Spec{Name: "a", URL: "http://a:1"}, "at least one model"},
		{Spec{Name: "a", URL: "http://u:pw123@a:1", Models: []string{"m"}}, "url holds credentials (user:password@): give the backend's key as its api_key"},
		{Spec{Name: "a", URL: "htp://u:pw123@a:1", Models: []string{"m"}}, `url "htp://***@a:1": want http://`},
	}
	for _, tt := range tests {
		_, err := NewBackend(tt.spec, budgetOf(1), nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want %q", tt.spec, err, tt.want)
		} else if strings.Contains(err.Error(), "pw123") {
			t.Errorf("%+v: the error shows the password: %v", tt.spec, err)
		}
	}
}

// Probe rounds and their timeouts run on the backends' clock: the first
// round at once, the next an interval later on the clock, and a health
// check that hangs fails when the clock passes its timeout.
func TestRunProbesOnTheClock(t *testing.T) {
	var checks atomic.Int64
	hang := make(chan struct{})
	defer close(hang)
	var hanging atomic.Bool
	addr, _ := serve(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/health" {
			checks.Add(1)
			if hanging.Load() {
				<-hang
			}
		}
	})
	c := newClock()
	be, err := NewBackend(Spec{Name: "s", URL: "http://" + addr, Models: []string{"m"}, FailThreshold: 1, MetricsPath: "-",
		HealthInterval: time.Second, HealthTimeout: 2 * time.Second}, budgetOf(1), c)
	if err != nil {
		t.Fatal(err)
	}
	rounds := make(chan struct{}, 8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- NewPool([]*Backend{be}).Run(ctx, func(*Backend, KVReport, bool) { rounds <- struct{}{} })
	}()
	defer func() {
		cancel()
		<-done
	}()
	<-rounds // the first, at once
	hanging.Store(true)
	for c.Pending() != 1 { // the round's wait is on the clock
		time.Sleep(time.Millisecond)
	}
	c.Advance(time.Second - time.Nanosecond)
	if n := checks.Load(); n != 1 {
		t.Fatalf("%d health checks before the interval passed", n)
	}
	c.Advance(time.Nanosecond)
	for checks.Load() != 2 || c.Pending() != 1 { // the check is in, its timeout armed
		time.Sleep(time.Millisecond)
	}
	if be.State() != StateClosed {
		t.Fatalf("hanging check: %s before its timeout", be.State())
	}
	c.Advance(2 * time.Second)
	<-rounds
	if be.State() != StateOpen || !strings.Contains(be.LastError(), "deadline") {
		t.Fatalf("after the health timeout on the clock: %s, %q", be.State(), be.LastError())
	}
}
