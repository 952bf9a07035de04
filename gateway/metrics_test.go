package gateway

import (
	"bufio"
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/internal/metricdoc"
)

// metricsExtra is a configuration with everything that labels a series:
// classes, tenants with keys, two GPUs.
const metricsExtra = `tenants:
  - {name: search, api_keys: [sk-search], class: critical, share: 0.5}
  - {name: batch, api_keys: [sk-batch], class: sheddable, share: 0.3}
`

func metricsConfig(simURL, deadURL string) string {
	// A second backend on its own GPU, never reachable: its series must
	// exist all the same.
	return baseConfig(simURL, `  - name: gpu1
    url: `+deadURL+`
    models: [llama-3-8b]
    gpu_memory: 24GiB
    health: {interval: 50ms, failures: 1, cooldown: 1h}
    metrics: {interval: 50ms}
    kv_events: {endpoint: "tcp://`+strings.TrimPrefix(deadURL, "http://")+`", retry: 1h}
`+metricsExtra)
}

func scrapeGateway(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fams, err := metricdoc.Scrape(ctx, url+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func isRuntimeFamily(name string) bool {
	return strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_")
}

// deadURL is a loopback address nothing listens on (any more).
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return "http://" + ln.Addr().String()
}

// The table in docs/METRICS.md is what /metrics serves: every family, its
// type and its labels, after traffic of every kind has passed.
func TestMetricsMatchDocs(t *testing.T) {
	_, simURL := startSim(t, nil)
	_, gwURL := startGateway(t, metricsConfig(simURL, deadURL(t)), Options{})
	postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 4, true), "Authorization", "Bearer sk-search")
	postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 4, false), "Authorization", "Bearer sk-batch")
	rows, err := metricdoc.ParseFile("../docs/METRICS.md", "kvgate serve")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range metricdoc.Compare(rows, scrapeGateway(t, gwURL), isRuntimeFamily) {
		t.Error(d)
	}
}

// The gateway's names follow the rules in docs/METRICS.md, the Go
// runtime's included.
func TestMetricNamingRules(t *testing.T) {
	_, simURL := startSim(t, nil)
	_, gwURL := startGateway(t, metricsConfig(simURL, deadURL(t)), Options{})
	for _, p := range metricdoc.Lint(scrapeGateway(t, gwURL), nil) {
		t.Error(p)
	}
}

// Before any request, every series a dashboard plots exists at zero for
// every configured class, tenant, backend and reason.
func TestLabelledSeriesExistAtZero(t *testing.T) {
	_, simURL := startSim(t, nil)
	_, gwURL := startGateway(t, metricsConfig(simURL, deadURL(t)), Options{DisableProbes: true})
	fams := scrapeGateway(t, gwURL)
	has := func(name string, labels map[string]string) {
		t.Helper()
		f := fams[name]
		for _, m := range f.GetMetric() {
			match := true
			for k, v := range labels {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
					match = false
				}
			}
			if !match {
				continue
			}
			var v float64
			switch {
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Histogram != nil:
				v = float64(m.GetHistogram().GetSampleCount())
			}
			if v != 0 && name != "kvgate_kv_capacity_bytes" && name != "kvgate_backend_up" && name != "kvgate_backend_state" {
				t.Errorf("%s%v = %g before any request", name, labels, v)
			}
			return
		}
		t.Errorf("%s%v does not exist", name, labels)
	}
	for _, gpu := range []string{"gpu0", "gpu1"} {
		for _, class := range []string{"critical", "standard", "sheddable"} {
			for _, tenant := range []string{"search", "batch"} {
				has("kvgate_admissions_total", map[string]string{"gpu": gpu, "class": class, "tenant": tenant, "queued": "true"})
			}
		}
		has("kvgate_kv_capacity_bytes", map[string]string{"gpu": gpu})
		has("kvgate_kv_used_bytes", map[string]string{"gpu": gpu})
		has("kvgate_admission_backfilled_total", map[string]string{"gpu": gpu, "model": "llama-3-8b"})
	}
	for _, class := range []string{"critical", "standard", "sheddable"} {
		has("kvgate_queue_depth", map[string]string{"model": "llama-3-8b", "class": class})
		has("kvgate_queue_wait_seconds", map[string]string{"model": "llama-3-8b", "class": class, "result": "admitted"})
		for _, tenant := range []string{"search", "batch"} {
			for _, reason := range []string{"too_large", "queue_full", "queue_timeout", "overloaded", "tenant_quota", "no_route", "canceled"} {
				has("kvgate_admission_rejections_total", map[string]string{"model": "llama-3-8b", "class": class, "tenant": tenant, "reason": reason})
			}
		}
	}
	for _, tenant := range []string{"search", "batch"} {
		has("kvgate_tenant_kv_held_bytes", map[string]string{"tenant": tenant})
		has("kvgate_tenant_queue_depth", map[string]string{"tenant": tenant})
	}
	has("kvgate_output_tokens_generated_total", map[string]string{"model": "llama-3-8b"})
	for outcome, reasons := range requestReasons {
		for _, r := range reasons {
			has("kvgate_requests_total", map[string]string{"model": "llama-3-8b", "outcome": outcome, "reason": r})
		}
	}
	for _, be := range []string{"gpu0", "gpu1"} {
		for _, st := range []string{"closed", "half-open", "open"} {
			has("kvgate_backend_state", map[string]string{"backend": be, "state": st})
		}
		for _, k := range []string{"transport", "status", "tokenize"} {
			has("kvgate_upstream_errors_total", map[string]string{"backend": be, "kind": k})
		}
		has("kvgate_backend_preemptions_total", map[string]string{"backend": be})
		has("kvgate_backend_kv_usage_ratio", map[string]string{"backend": be})
	}
	has("kvgate_time_to_first_token_seconds", map[string]string{"model": "llama-3-8b"})
	has("kvgate_inter_token_latency_seconds", map[string]string{"model": "llama-3-8b"})
	for _, tenant := range []string{"search", "batch"} {
		for _, kind := range []string{"prompt", "output"} {
			has("kvgate_tokens_actual_total", map[string]string{"model": "llama-3-8b", "kind": kind, "tenant": tenant})
			has("kvgate_tokens_predicted_total", map[string]string{"model": "llama-3-8b", "kind": kind, "tenant": tenant})
		}
	}
	has("kvgate_config_reloads_total", map[string]string{"result": "error"})
}

// A reload that adds a class and a tenant makes their series exist at once.
func TestReloadSeedsNewSeries(t *testing.T) {
	_, simURL := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(simURL, ""), Options{DisableProbes: true})
	cfg, err := Parse([]byte(baseConfig(simURL, metricsExtra+`admission:
  classes: [{name: critical}, {name: gold}, {name: standard}, {name: sheddable}]
`)), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	fams := scrapeGateway(t, gwURL)
	found := false
	for _, m := range fams["kvgate_admissions_total"].GetMetric() {
		var class, tenant string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "class":
				class = l.GetValue()
			case "tenant":
				tenant = l.GetValue()
			}
		}
		found = found || (class == "gold" && tenant == "search")
	}
	if !found {
		t.Error("no kvgate_admissions_total{class=gold,tenant=search} after the reload that added them")
	}
}

// The backend's state is one 0/1 series per state, and follows the circuit.
func TestBackendStateSeries(t *testing.T) {
	_, simURL := startSim(t, nil)
	_, gwURL := startGateway(t, metricsConfig(simURL, deadURL(t)), Options{})
	state := func() map[string]string {
		cur := map[string]string{}
		for _, m := range scrapeGateway(t, gwURL)["kvgate_backend_state"].GetMetric() {
			var be, st string
			for _, l := range m.GetLabel() {
				if l.GetName() == "backend" {
					be = l.GetValue()
				} else {
					st = l.GetValue()
				}
			}
			if m.GetGauge().GetValue() == 1 {
				cur[be] = st
			}
		}
		return cur
	}
	eventually(t, "the dead backend's circuit to open", func() bool { return state()["gpu1"] == "open" })
	if s := state()["gpu0"]; s != "closed" {
		t.Errorf("gpu0 is %q, want closed", s)
	}
	for _, m := range scrapeGateway(t, gwURL)["kvgate_backend_up"].GetMetric() {
		want := 1.0
		if m.GetLabel()[0].GetValue() == "gpu1" {
			want = 0
		}
		if m.GetGauge().GetValue() != want {
			t.Errorf("kvgate_backend_up{%s} = %g, want %g", m.GetLabel()[0].GetValue(), m.GetGauge().GetValue(), want)
		}
	}
}

// A file that fails to load is a failed reload: counted, and the
// last-reload gauge says so until a good one comes.
func TestReloadFromCountsFailures(t *testing.T) {
	_, simURL := startSim(t, nil)
	clock := admissiontest.NewClock(time.Unix(1_800_000_000, 0))
	gw, gwURL := startGateway(t, baseConfig(simURL, ""), Options{DisableProbes: true, Clock: clock})
	value := func(name, result string) float64 {
		for _, m := range scrapeGateway(t, gwURL)[name].GetMetric() {
			if result == "" || m.GetLabel()[0].GetValue() == result {
				if m.Counter != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
		t.Fatalf("no %s{%s}", name, result)
		return 0
	}
	if err := gw.ReloadFrom(func() (*Config, error) { return nil, errors.New("yaml: line 3: did not find expected key") }); err == nil {
		t.Fatal("a failed load reloaded")
	}
	if v := value("kvgate_config_last_reload_successful", ""); v != 0 {
		t.Errorf("last_reload_successful = %g after a failed load", v)
	}
	if v := value("kvgate_config_reloads_total", "error"); v != 1 {
		t.Errorf("reloads{error} = %g", v)
	}
	clock.Advance(time.Minute)
	now := clock.Now()
	if err := gw.ReloadFrom(func() (*Config, error) { return Parse([]byte(baseConfig(simURL, "")), ".") }); err != nil {
		t.Fatal(err)
	}
	if v := value("kvgate_config_last_reload_successful", ""); v != 1 {
		t.Errorf("last_reload_successful = %g after a good reload", v)
	}
	if v := value("kvgate_config_last_reload_success_timestamp_seconds", ""); v != float64(now.Unix()) {
		t.Errorf("last reload time %g, want %d", v, now.Unix())
	}
}

// Every reason the package's code records is one that exists at zero from
// the start (backend_<status> excepted: it is built from the backend's
// answer).
func TestRequestReasonsCoverTheCode(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	known := map[string]bool{}
	for _, rs := range requestReasons {
		for _, r := range rs {
			known[r] = true
		}
	}
	outcomes := map[string]bool{"outcomeOK": true, "outcomeShed": true, "outcomeRejected": true, "outcomeFailed": true, "outcomeCanceled": true}
	found := 0
	check := func(exprs []ast.Expr) {
		// A reason is the string literal right after an outcome constant.
		for i := 0; i+1 < len(exprs); i++ {
			id, ok := exprs[i].(*ast.Ident)
			if !ok || !outcomes[id.Name] {
				continue
			}
			lit, ok := exprs[i+1].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				continue
			}
			r, _ := strconv.Unquote(lit.Value)
			found++
			if !known[r] {
				t.Errorf("%s: reason %q is not in requestReasons", fset.Position(lit.Pos()), r)
			}
		}
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				check(n.Args)
			case *ast.AssignStmt:
				check(n.Rhs)
			case *ast.ReturnStmt:
				check(n.Results)
			}
			return true
		})
	}
	if found < 10 {
		t.Fatalf("found only %d reasons in the package: the scan no longer matches the code", found)
	}
}

// The time to the first token is observed once per request that streams
// text, whether its events are told apart by the fast scan (one choice) or
// parsed (several), and never for an answer that is not streamed.
func TestTimeToFirstTokenOncePerStream(t *testing.T) {
	_, simURL := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(simURL, ""), Options{DisableProbes: true})
	ttft := func() float64 {
		v, ok := metricValue(t, gw, "kvgate_time_to_first_token_seconds", map[string]string{"model": "llama-3-8b"})
		if !ok {
			t.Fatal("no kvgate_time_to_first_token_seconds")
		}
		return v
	}
	for _, c := range []struct {
		name, path, body string
		want             float64
	}{
		{"chat, streamed", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}`, 1},
		{"completion, streamed", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":8,"stream":true}`, 1},
		{"two choices, streamed", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":8,"n":2,"stream":true}`, 1},
		{"not streamed", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := ttft()
			if r := postJSON(gwURL, c.path, c.body); r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if got := ttft() - before; got != c.want {
				t.Errorf("observed %g times, want %g", got, c.want)
			}
		})
	}
}

// The time to the first token is taken at the first token, not at the
// stream's end: it is observed by the time the client has that token, while
// the backend still holds the rest of the stream back.
func TestTimeToFirstTokenAtTheFirstToken(t *testing.T) {
	gate := make(chan struct{})
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			w.Write(cannedToken)
			w.Flush()
			<-gate
			w.Write(cannedLast)
			w.Flush()
		})
	}}
	backend := serveLoopback(t, srv.Serve, srv.ShutdownWithContext)
	cfg := strings.Replace(baseConfig(backend, ""), "tokenizer: backend", "tokenizer: estimate", 1)
	gw, gwURL := startGateway(t, cfg, Options{DisableProbes: true})
	defer close(gate)

	resp, err := http.Post(gwURL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(first, `"content":" one"`) {
		t.Fatalf("first line %q: %v", first, err)
	}
	if n, _ := metricValue(t, gw, "kvgate_time_to_first_token_seconds", map[string]string{"model": "llama-3-8b"}); n != 1 {
		t.Fatalf("the client has its first token, and the time to it was observed %g times", n)
	}
}

// The inter-token latency is observed between successive tokens of a
// stream's first choice: max_tokens − 1 times for a stream that generates
// them all, whatever n is, and never for an answer that is not streamed.
func TestInterTokenLatencyPerToken(t *testing.T) {
	_, simURL := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(simURL, ""), Options{DisableProbes: true})
	itl := func() float64 {
		v, ok := metricValue(t, gw, "kvgate_inter_token_latency_seconds", map[string]string{"model": "llama-3-8b"})
		if !ok {
			t.Fatal("no kvgate_inter_token_latency_seconds")
		}
		return v
	}
	for _, c := range []struct {
		name, path, body string
		want             float64
	}{
		{"chat, streamed", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}`, 7},
		{"completion, streamed", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":5,"stream":true}`, 4},
		{"two choices, streamed", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":8,"n":2,"stream":true}`, 7},
		{"one token", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":1,"stream":true}`, 0},
		{"not streamed", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := itl()
			if r := postJSON(gwURL, c.path, c.body); r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			// The relay observes the last gap before it relays [DONE].
			if got := itl() - before; got != c.want {
				t.Errorf("observed %g times, want %g", got, c.want)
			}
		})
	}
}

// Prompt and output tokens are counted under the tenant whose key sent the
// request, and under no other.
func TestTokensByTenant(t *testing.T) {
	_, simURL := startSim(t, nil)
	extra := "tenants: [{name: a, api_keys: [key-a]}, {name: b, api_keys: [key-b]}]\n"
	gw, gwURL := startGateway(t, baseConfig(simURL, extra), Options{DisableProbes: true})
	for _, c := range []struct {
		key    string
		stream bool
	}{{"key-a", false}, {"key-a", true}, {"key-b", true}} {
		if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 6, c.stream), "Authorization", "Bearer "+c.key); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	eventually(t, "the last stream's usage", func() bool {
		v, _ := metricValue(t, gw, "kvgate_tokens_actual_total", map[string]string{"tenant": "b", "kind": "output"})
		return v == 6
	})
	for _, c := range []struct {
		tenant, name, kind string
		want               float64
	}{
		{"a", "kvgate_tokens_actual_total", "output", 12},
		{"b", "kvgate_tokens_actual_total", "output", 6},
		{"a", "kvgate_tokens_predicted_total", "output", 12},
		{"b", "kvgate_tokens_predicted_total", "output", 6},
	} {
		if v, _ := metricValue(t, gw, c.name, map[string]string{"model": "llama-3-8b", "tenant": c.tenant, "kind": c.kind}); v != c.want {
			t.Errorf("%s{tenant=%q,kind=%q} = %g, want %g", c.name, c.tenant, c.kind, v, c.want)
		}
	}
	for _, tenant := range []string{"a", "b"} {
		if v, _ := metricValue(t, gw, "kvgate_tokens_actual_total", map[string]string{"tenant": tenant, "kind": "prompt"}); v <= 0 {
			t.Errorf("tenant %s: no prompt tokens counted", tenant)
		}
	}
}
