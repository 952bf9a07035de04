package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends/sim"
)

func TestLoadtestFlagErrors(t *testing.T) {
	dir := t.TempDir()
	tgt := []string{"loadtest", "--target", "http://127.0.0.1:1"}
	with := func(extra ...string) []string { return append(append([]string(nil), tgt...), extra...) }
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"loadtest"}, "--target: required"},
		{[]string{"loadtest", "--target", "localhost:8000"}, "--target: "},
		{[]string{"loadtest", "--target", "ftp://h"}, "--target: \"ftp://h\": want an http:// or https:// URL"},
		{[]string{"loadtest", "--target", "http://u:secret@h"}, "--target: "},
		{with("--compare", "a=http://h"), "--compare: give --target or --compare, not both"},
		{[]string{"loadtest", "--compare", "http://h"}, "--compare: want NAME=URL"},
		{[]string{"loadtest", "--compare", "a=http://h,a=http://g"}, `--compare: target name "a" given twice`},
		{[]string{"loadtest", "--compare", "a=nope"}, "--compare: a: "},
		{with("--concurrency", "0"), "--concurrency: \"0\" must be positive"},
		{with("--concurrency", "1..8x1"), "--concurrency: "},
		{with("--rate", "fast"), "--rate: \"fast\" is not a number"},
		{with("--rate", "1", "--concurrency", "1"), "--rate: give --concurrency or --rate, not both"},
		{with("--prompt-tokens", "uniform:9-1"), "--prompt-tokens: \"uniform:9-1\": uniform:A-B: A (9) is greater than B (1)"},
		{with("--output-tokens", "normal:100"), "--output-tokens: "},
		{with("--prompt-tokens", "file:"+filepath.Join(dir, "none.txt")), "--prompt-tokens: "},
		{with("--max-kv-usage", "1.5"), "--max-kv-usage: must be in (0, 1]"},
		{with("--max-kv-usage", "0"), "--max-kv-usage: must be in (0, 1]"},
		{with("--ceiling", "0.9"), "renamed --max-kv-usage"},
		{with("--slo-ttft", "-1s"), "--slo-ttft: must be positive"},
		{with("--slo-e2e", "0s"), "--slo-e2e: must be positive"},
		{with("--slo-attainment", "0"), "--slo-attainment: must be in (0, 1]"},
		{with("--confidence", "1"), "--confidence: must be in [0.5, 1)"},
		{with("--requests", "0"), "--requests: must be ≥ 1"},
		{with("--requests", "-5"), "--requests: must be ≥ 1"},
		{with("--duration", "0s"), "--duration: must be positive"},
		{with("--warmup", "-2"), "--warmup: must be -1"},
		{with("--max-reruns", "-1"), "--max-reruns: must be ≥ 0"},
		{with("--min-requests", "-1"), "--min-requests: must be ≥ 0"},
		{with("--request-timeout", "0s"), "--request-timeout: must be at least"},
		{with("--scrape-interval", "1ms"), "--scrape-interval: must be at least 10ms"},
		{with("--cooldown", "-1s"), "--cooldown: must be ≥ 0"},
		{with("--endpoint", "embeddings"), "--endpoint: want chat or completions"},
		{with("--progress", "fancy"), "--progress: want auto, bar, lines or none"},
		{with("--search-max", "64"), "--search-max: only applies with --search"},
		{with("--search-tolerance", "2"), "--search-tolerance: only applies with --search"},
		{with("--search", "--search-tolerance", "0"), "--search-tolerance: want a positive number"},
		{with("--search", "--search-tolerance", "150%"), "--search-tolerance: a percentage must be in (0, 100)"},
		{with("--search", "--search-max", "2.5"), "--search-max: want a level of at least 1"},
		{with("--search", "--concurrency", "16", "--search-max", "8"), "--search-max: 8 is below the first level 16"},
		{with("--search", "--keep-going"), "--keep-going: a --search decides its own levels"},
		{with("--metrics-url", "a=http://m,b=http://n"), "--metrics-url: want one URL"},
		{with("--metrics-url", "nope"), "--metrics-url: "},
		{with("--json", filepath.Join(dir, "missing", "r.json")), "--json: "},
		{with("--html", filepath.Join(dir, "missing", "r.html")), "--html: "},
		{with("--price", "cheap"), `--price: price "cheap": want a number per hour`},
		{with("--price", "-1/h"), "--price: "},
		{[]string{"loadtest", "--compare", "a=http://x:1@1/h", "--price", "2/h"}, "--price: with --compare, give each target's price there"},
		{[]string{"loadtest", "--compare", "a=http://x:1@two/h"}, `--compare: a: price "two/h"`},
		{with("--bogus"), "flag provided but not defined: -bogus"},
		{with("stray"), `unexpected argument "stray"`},
	} {
		code, _, errOut := runCLI(t, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tc.args[1:], code, errOut, tc.want)
		}
	}
}

// --compare NAME=URL@PRICE/h prices a target; an @ not followed by a price
// is left to the URL (and its user info refused there).
func TestLoadtestComparePrices(t *testing.T) {
	ts, err := parseCompare("a100=http://a:8000@2.10/h,l4=http://b:8000/v1@0.80/h,free=http://c:8000")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		url   string
		price float64
	}{{"http://a:8000", 2.10}, {"http://b:8000/v1", 0.80}, {"http://c:8000", 0}}
	for i, w := range want {
		if ts[i].URL != w.url || ts[i].PricePerHour != w.price {
			t.Errorf("target %d: %+v, want %+v", i, ts[i], w)
		}
	}
	if _, err := parseCompare("a=http://user@c:8000"); err == nil || !strings.Contains(err.Error(), "credentials") {
		t.Errorf("user info: %v", err)
	}
}

func TestLoadtestMetricsURLForms(t *testing.T) {
	ts, err := parseCompare("direct=http://sim:8000, gateway=http://gw:8080/v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := applyMetricsURL(ts, "http://sim:8000/metrics"); err != nil || ts[0].MetricsURL != ts[1].MetricsURL {
		t.Errorf("one URL for all: %+v %v", ts, err)
	}
	if err := applyMetricsURL(ts, "direct=http://sim:8000/metrics,gateway=none"); err != nil ||
		ts[0].MetricsURL != "http://sim:8000/metrics" || ts[1].MetricsURL != "none" {
		t.Errorf("per target: %+v %v", ts, err)
	}
}

// startLoadtestSim serves an in-process simulated vLLM that overflows
// (oom) past its KV pool: a 20 GiB card holds about a thousand blocks of
// 16 tokens, so 8 requests of 1280 tokens fit under a 75% ceiling and 16
// do not fit at all. It runs at 1/20 of real time: a request lasts about
// 60 ms, long enough that 16 started together meet in the server however
// busy the machine is.
func startLoadtestSim(t *testing.T, gpu int64) string {
	t.Helper()
	s, err := sim.New(sim.Config{GPUMemory: gpu, OnOverflow: sim.OverflowOOM, TimeScale: 0.05, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

func loadtestArgs(url string, extra ...string) []string {
	return append([]string{"loadtest", "--target", url, "--requests", "20", "--prompt-tokens", "fixed:1216", "--output-tokens", "fixed:64",
		"--scrape-interval", "20ms", "--cooldown", "5s", "--progress", "lines"}, extra...)
}

func TestLoadtestAgainstSim(t *testing.T) {
	url := startLoadtestSim(t, 20<<30)
	dir := t.TempDir()
	js, cs, hs := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.csv"), filepath.Join(dir, "r.html")
	code, out, errOut := runCLI(t, loadtestArgs(url, "--concurrency", "2,4,8,16,32", "--json", js, "--csv", cs, "--html", hs)...)
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	host := strings.TrimPrefix(url, "http://")
	for _, want := range []string{"conc", "kv peak", "Safe concurrency for " + host + ": 8 — ", "It first breaks at 16: overflow"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "step "+host+" c=16: started") || strings.Contains(errOut, "\r") {
		t.Errorf("plain progress lines expected on a non-terminal:\n%s", errOut)
	}
	raw, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Safe   *float64         `json:"safe_concurrency"`
		Steps  []map[string]any `json:"steps"`
		Config map[string]any   `json:"config"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("--json: %v", err)
	}
	if rep.Safe == nil || *rep.Safe != 8 || len(rep.Steps) != 4 || rep.Config["prompt_tokens"] != "fixed:1216" {
		t.Errorf("--json: safe %v, %d steps, config %v", rep.Safe, len(rep.Steps), rep.Config)
	}
	f, err := os.Open(cs)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if rows, err := csv.NewReader(f).ReadAll(); err != nil || len(rows) != 5 {
		t.Errorf("--csv: %d rows, %v", len(rows), err)
	}
	if page, err := os.ReadFile(hs); err != nil || strings.Count(string(page), "<svg ") != 6 {
		t.Errorf("--html: %v", err)
	}
}

func TestLoadtestNothingSafeExitsOne(t *testing.T) {
	url := startLoadtestSim(t, 20<<30)
	js := filepath.Join(t.TempDir(), "r.json")
	code, out, errOut := runCLI(t, loadtestArgs(url, "--concurrency", "16,32", "--json", js)...)
	if code != exitNo || !strings.Contains(out, "No concurrency level is safe") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	raw, _ := os.ReadFile(js)
	var rep map[string]any
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if v, ok := rep["safe_concurrency"]; !ok || v != nil {
		t.Errorf("safe_concurrency = %v (present %v), want null", v, ok)
	}
}

func TestLoadtestUnreachableTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	code, _, errOut := runCLI(t, "loadtest", "--target", url, "--progress", "none")
	if code != exitNo || !strings.Contains(errOut, "cannot find a model to load (pass --model)") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}
