package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
	"github.com/kvgate/kvgate/backends/gpuinfo"
	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/internal/metricdoc"
)

const (
	dashboardFile = "grafana/kvgate.json"
	alertsFile    = "prometheus/alerts.yaml"
)

// live is the set of sample names a gateway and its vLLM-named backend
// serve after load of every kind went through: ok, streamed, queued, shed,
// refused. A histogram contributes its _bucket, _sum and _count. The
// gateway runs with the shared budget, on a real redis-server that the
// first test asking for the set starts (and stops when it ends: the scrape
// is over by then), so that the lease and fallback series the rules use
// are served too.
func live(t testing.TB) (map[string]bool, error) {
	liveOnce.Do(func() { liveNames, liveErr = scrapeUnderLoad(sharedbudgettest.StartRedis(t).URL()) })
	return liveNames, liveErr
}

var (
	liveOnce  sync.Once
	liveNames map[string]bool
	liveErr   error
)

func scrapeUnderLoad(redisURL string) (map[string]bool, error) {
	s, err := sim.New(sim.Config{TimeScale: 0.01, Seed: 1})
	if err != nil {
		return nil, err
	}
	sln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go s.Serve(sln)
	defer s.Shutdown(context.Background())
	simURL := "http://" + sln.Addr().String()
	// The GPU node's kvgate gpus, as the gateway's gpu_watch reads it: the
	// backend's process (on the simulator's port) and another one.
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(gpuinfo.Nodes{Devices: []gpuinfo.Device{{Index: 0, UUID: "GPU-0", Total: 24 << 30, Used: 23 << 30, Free: 1 << 30,
			Processes: []gpuinfo.Process{{PID: 17, Name: "vllm", Used: 20 << 30, Ports: []int{sln.Addr().(*net.TCPAddr).Port}},
				{PID: 4242, Name: "python3", Used: 2 << 30}}}}})
	}))
	defer node.Close()
	cfg, err := gateway.Parse([]byte(`admission:
  queue: {max_requests: 4}
shared_budget: {redis: '`+redisURL+`', replicas: 2}
gpu_watch: {source: '`+node.URL+`/gpus', interval: 50ms, free_floor: 2GiB}
tenants:
  - {name: search, api_keys: [sk-search], class: critical}
  - {name: batch, api_keys: [sk-batch], class: sheddable, share: 0.5}
models:
  - name: llama-3-8b
    geometry: {layers: 32, kv_heads: 8, head_dim: 128, dtype: bfloat16}
    weights_bytes: 16060522496
    max_model_len: 8192
    tokenizer: backend
backends:
  - name: sim0
    url: `+simURL+`
    models: [llama-3-8b]
    gpu_memory: 24GiB
    health: {interval: 50ms}
    metrics: {interval: 50ms}
`), ".")
	if err != nil {
		return nil, err
	}
	gw, err := gateway.New(cfg, gateway.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go gw.Serve(gln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gw.Shutdown(ctx)
	}()
	gwURL := "http://" + gln.Addr().String()

	// 24 streams of 2000-token outputs hold more than the budget: some
	// queue, and with four queue places per class the rest are shed.
	client := &http.Client{Timeout: time.Minute}
	post := func(key, body string) (int, error) {
		req, _ := http.NewRequest("POST", gwURL+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	var wg sync.WaitGroup
	codes := make(chan int, 64)
	for i := range 24 {
		key := "sk-search"
		if i%2 == 1 {
			key = "sk-batch"
		}
		wg.Go(func() {
			code, err := post(key, fmt.Sprintf(`{"model":"llama-3-8b","prompt":"request %d","max_tokens":2000,"stream":%t}`, i, i%3 != 0))
			if err == nil {
				codes <- code
			}
		})
	}
	wg.Wait()
	close(codes)
	seen := map[int]int{}
	for c := range codes {
		seen[c]++
	}
	if seen[200] == 0 || seen[429] == 0 {
		return nil, fmt.Errorf("the load did not both serve and shed: status codes %v", seen)
	}
	post("sk-search", `{"model":"llama-3-8b","prompt":"x","max_tokens":8000,"n":8}`) // kv_budget_exceeded
	post("sk-search", `{"model":"nope","prompt":"x"}`)                               // unknown_model

	names := map[string]bool{}
	for _, u := range []string{gwURL + "/metrics", simURL + "/metrics"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		fams, err := metricdoc.Scrape(ctx, u)
		cancel()
		if err != nil {
			return nil, err
		}
		for name, f := range fams {
			names[name] = true
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
			case dto.MetricType_SUMMARY:
				names[name+"_sum"], names[name+"_count"] = true, true
			}
		}
	}
	return names, nil
}

var promql = parser.NewParser(parser.Options{})

// metricNames are the metric names an expression's selectors name.
func metricNames(t *testing.T, where, expr string) []string {
	t.Helper()
	e, err := promql.ParseExpr(expr)
	if err != nil {
		t.Fatalf("%s: %v\n%s", where, err, expr)
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch s := n.(type) {
		case *parser.VectorSelector:
			name := s.Name
			if name == "" {
				for _, m := range s.LabelMatchers {
					if m.Name == model.MetricNameLabel {
						name = m.Value
					}
				}
			}
			if name == "" {
				t.Errorf("%s: a selector without a metric name: %s", where, s)
			}
			out = append(out, name)
		}
		return nil
	})
	if len(out) == 0 {
		t.Errorf("%s: no metric in %s", where, expr)
	}
	return out
}

// checkNames fails for every name that is not served under load.
func checkNames(t *testing.T, used map[string][]string) {
	t.Helper()
	names, err := live(t)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for n := range used {
		keys = append(keys, n)
	}
	sort.Strings(keys)
	for _, n := range keys {
		if !names[n] {
			t.Errorf("%s (used by %s) is not on the gateway's or the backend's /metrics", n, strings.Join(used[n], "; "))
		}
	}
}

// Grafana's variables, replaced by values PromQL accepts.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// Every query of the dashboard parses as PromQL and names only series that
// a gateway and a vLLM-named backend serve under load; the panels the issue
// asks for are there.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q", d.UID, d.Title)
	}
	used := map[string][]string{}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		used[m[1]] = append(used[m[1]], "variable "+v.Name)
	}
	ids := map[int]bool{}
	titles := map[string]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d twice", p.ID)
			}
			ids[p.ID] = true
			titles[p.Title] = true
			if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W <= 0 {
				t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, p.GridPos)
			}
			if p.Type != "row" {
				if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
					t.Errorf("panel %q: datasource is not the dashboard's ${datasource} variable", p.Title)
				}
				if len(p.Targets) == 0 {
					t.Errorf("panel %q has no query", p.Title)
				}
			}
			for _, tg := range p.Targets {
				for _, v := range regexp.MustCompile(`\$\{?([a-z_]+)`).FindAllStringSubmatch(tg.Expr, -1) {
					if !strings.HasPrefix(v[1], "__") && !vars[v[1]] {
						t.Errorf("panel %q: $%s is not a dashboard variable", p.Title, v[1])
					}
				}
				where := fmt.Sprintf("panel %q query %s", p.Title, tg.RefID)
				for _, n := range metricNames(t, where, grafanaVars.Replace(tg.Expr)) {
					used[n] = append(used[n], where)
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	// What the dashboard is for (the names of its panels, as operators
	// look for them).
	for _, want := range []string{"KV: capacity, held, committed, real use", "Queue depth per class", "Queue wait p50 / p99 per class",
		"Sheds by reason", "Predicted vs generated output tokens", "Time to first token p50 / p99", "End-to-end latency p50 / p99",
		"Backend state", "Preemptions", "Overflow: KV usage the backends report"} {
		if !titles[want] {
			t.Errorf("no panel %q", want)
		}
	}
	checkNames(t, used)
}

// The alert rules pass Prometheus's rule parser (unknown fields, templates
// and PromQL included), every alert has a severity and a summary, and every
// series they use is served. The alerts the issue asks for are
// there.
func TestAlertRules(t *testing.T) {
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, promql, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	used := map[string][]string{}
	alerts := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: wants a severity label and summary and description annotations", r.Alert)
			}
			for _, n := range metricNames(t, r.Alert, r.Expr) {
				used[n] = append(used[n], "alert "+r.Alert)
			}
		}
	}
	for _, want := range []string{"KvgateKVAboveCeiling", "KvgateBackendPreempting", "KvgateShedRateHigh", "KvgateBackendDown",
		"KvgateConfigReloadFailed", "KvgateSharedBudgetFallback"} {
		if !alerts[want] {
			t.Errorf("no alert %s", want)
		}
	}
	checkNames(t, used)
}
