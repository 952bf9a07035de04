package loadtest

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func decodeJSON(t *testing.T, r *Report) map[string]any {
	t.Helper()
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("report JSON does not parse: %v\n%s", err, raw)
	}
	return m
}

func TestRunAgainstFakeServer(t *testing.T) {
	rep := fakeRun(t, nil)
	if !rep.HasSafe || rep.Safe != 4 || rep.FirstFailure == nil || rep.FirstFailure.Level != 8 {
		t.Fatalf("safe %g, first failure %+v\n%s", rep.Safe, rep.FirstFailure, rep.Answer)
	}
	c := rep.Targets[0].Calibration
	if c.Source != "estimate" || !strings.Contains(c.Note, "no target could tokenize") {
		t.Errorf("a target without /tokenize: calibration %+v", c)
	}
	if rep.Targets[0].Model != "fake-model" || rep.Targets[0].MaxModelLen != 4096 {
		t.Errorf("model %q max len %d, from /v1/models", rep.Targets[0].Model, rep.Targets[0].MaxModelLen)
	}
	four := stepAt(rep, "fake", 4)
	if four.KV == nil || four.KV.PeakUsage != 0.5 || four.Requests.Warmup != 0 || four.Requests.OK != 24 || four.MeanOutputTokens != 4 {
		t.Errorf("step 4: kv %+v requests %+v", four.KV, four.Requests)
	}
}

func TestReportJSONShape(t *testing.T) {
	m := decodeJSON(t, fakeRun(t, nil))
	if m["schema"] != Schema || m["mode"] != "concurrency" || m["safe_concurrency"] != 4.0 {
		t.Errorf("top level: schema %v mode %v safe_concurrency %v", m["schema"], m["mode"], m["safe_concurrency"])
	}
	if _, ok := m["safe_rate"]; ok {
		t.Error("a concurrency run has safe_rate")
	}
	for _, k := range []string{"answer", "first_failure", "stop_reason", "targets", "steps", "config", "started_at", "finished_at"} {
		if _, ok := m[k]; !ok {
			t.Errorf("top level lacks %q", k)
		}
	}
	steps := m["steps"].([]any)
	if len(steps) != 4 {
		t.Fatalf("%d steps", len(steps))
	}
	s := steps[2].(map[string]any)
	for _, k := range []string{"target", "mode", "level", "concurrency", "attempts", "window_s", "requests", "requests_per_s",
		"output_tokens_per_s", "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "slo", "kv", "saturation", "verdict", "safe", "reasons"} {
		if _, ok := s[k]; !ok {
			t.Errorf("step lacks %q", k)
		}
	}
	if s["level"] != 4.0 || s["verdict"] != "safe" || s["safe"] != true {
		t.Errorf("step 4: %v %v %v", s["level"], s["verdict"], s["safe"])
	}
	req := s["requests"].(map[string]any)
	for _, k := range []string{"sent", "warmup", "warmup_overflow", "warmup_failed", "ok", "shed_429", "client_4xx", "server_5xx", "overflow", "conn_error", "timeout", "incomplete", "dropped"} {
		if _, ok := req[k]; !ok {
			t.Errorf("requests lacks %q", k)
		}
	}
	for _, k := range []string{"p50", "p90", "p99", "n"} {
		if _, ok := s["ttft_ms"].(map[string]any)[k]; !ok {
			t.Errorf("ttft_ms lacks %q", k)
		}
	}
	kv := s["kv"].(map[string]any)
	for _, k := range []string{"peak_usage", "preemptions", "peak_running", "peak_waiting", "curve", "source"} {
		if _, ok := kv[k]; !ok {
			t.Errorf("kv lacks %q", k)
		}
	}
	cfg := m["config"].(map[string]any)
	for _, k := range []string{"targets", "mode", "levels", "requests_per_step", "prompt_tokens", "output_tokens", "seed", "max_kv_usage",
		"slo_attainment", "confidence", "request_timeout_s", "scrape_interval_s"} {
		if _, ok := cfg[k]; !ok {
			t.Errorf("config lacks %q", k)
		}
	}
	if cfg["prompt_tokens"] != "fixed:50" || cfg["max_kv_usage"] != 0.75 {
		t.Errorf("config %v", cfg)
	}
	tg := m["targets"].([]any)[0].(map[string]any)
	if tg["safe_concurrency"] != 4.0 || tg["name"] != "fake" {
		t.Errorf("target: %v", tg)
	}
	if ff := m["first_failure"].(map[string]any); ff["level"] != 8.0 {
		t.Errorf("first failure %v", ff)
	}
}

func TestReportJSONNullWhenNothingSafe(t *testing.T) {
	rep := fakeRun(t, func(c *Config) { c.Concurrency = []int{8, 16} })
	m := decodeJSON(t, rep)
	v, ok := m["safe_concurrency"]
	if !ok || v != nil {
		t.Errorf("safe_concurrency = %v (present %v), want null", v, ok)
	}
	if !strings.HasPrefix(rep.Answer, "No concurrency level is safe for fake.") || !strings.Contains(rep.Answer, "It first breaks at 8") {
		t.Errorf("answer %q", rep.Answer)
	}
}

func TestReportJSONRateMode(t *testing.T) {
	// An open loop catches up after a stall, in a burst: no overflow here,
	// and KV slots for any burst a busy machine can make.
	f := &fakeOpenAI{kvSlots: 1000, oomAbove: 1000}
	rep := fakeRunOn(t, f, func(c *Config) { c.Concurrency, c.Rates = nil, []float64{50, 100} })
	m := decodeJSON(t, rep)
	if m["mode"] != "rate" || m["safe_rate"] != 100.0 {
		t.Errorf("mode %v safe_rate %v", m["mode"], m["safe_rate"])
	}
	if _, ok := m["safe_concurrency"]; ok {
		t.Error("a rate run has safe_concurrency")
	}
}

func TestCSVShape(t *testing.T) {
	rep := fakeRun(t, nil)
	var buf bytes.Buffer
	if err := WriteCSV(&buf, rep); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1+len(rep.Steps) {
		t.Fatalf("%d rows for %d steps", len(rows), len(rep.Steps))
	}
	if strings.Join(rows[0], ",") != strings.Join(CSVHeader, ",") {
		t.Errorf("header %v", rows[0])
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	for _, row := range rows[1:] {
		if len(row) != len(CSVHeader) {
			t.Fatalf("row of %d cells: %v", len(row), row)
		}
	}
	four, eight := rows[3], rows[4]
	if four[col["level"]] != "4" || four[col["safe"]] != "true" || four[col["ok"]] != "24" || four[col["kv_peak"]] != "0.5" {
		t.Errorf("row for 4: %v", four)
	}
	if eight[col["verdict"]] != "unsafe" || eight[col["overflow"]] == "0" || !strings.Contains(eight[col["reasons"]], "overflow") {
		t.Errorf("row for 8: %v", eight)
	}
	if four[col["slo_attainment"]] != "" {
		t.Errorf("no SLO, yet slo_attainment %q", four[col["slo_attainment"]])
	}
}

func TestTable(t *testing.T) {
	rep := fakeRun(t, nil)
	var buf bytes.Buffer
	if err := WriteTable(&buf, rep); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"conc", "req/s", "ttft p99", "kv peak", "verdict", "50.0%", "unsafe",
		"concurrency 8: overflow", "Safe concurrency for fake: 4"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "target ") {
		t.Errorf("one target, yet a target column:\n%s", out)
	}
}

func TestTooFewRequestsAreRerunAndPooled(t *testing.T) {
	rep := fakeRun(t, func(c *Config) { c.Concurrency, c.Requests, c.MinRequests = []int{2}, 12, 20 })
	s := stepAt(rep, "fake", 2)
	if s.Attempts != 2 || s.Requests.OK != 24 || !s.Safe {
		t.Errorf("attempts %d ok %d safe %v; want a re-run pooled to 24", s.Attempts, s.Requests.OK, s.Safe)
	}
	tr := rep.Targets[0].Trials
	if len(tr) != 2 || tr[0].Verdict != "inconclusive" || !strings.Contains(tr[0].Reason, "only 12 requests") || tr[1].Verdict != "safe" {
		t.Errorf("trials %+v", tr)
	}
}

func TestSLOAttainmentNeedsProof(t *testing.T) {
	// Every request meets a 1 s TTFT, but 100 of 100 do not prove 99%:
	// the step is re-run until 300 do.
	rep := fakeRun(t, func(c *Config) { c.Concurrency, c.Requests, c.SLOTTFT = []int{4}, 100, time.Second })
	s := stepAt(rep, "fake", 4)
	if s.Attempts != 3 || !s.Safe || s.SLO == nil || s.SLO.Judged != 300 || s.SLO.Verdict != "pass" || s.SLO.Low < 0.99 {
		t.Fatalf("attempts %d safe %v slo %+v", s.Attempts, s.Safe, s.SLO)
	}
	if !strings.Contains(rep.Answer, "100.0% within SLO") {
		t.Errorf("answer %q", rep.Answer)
	}
	// An SLO nobody meets fails at once, on the first attempt.
	rep = fakeRun(t, func(c *Config) { c.Concurrency, c.Requests, c.SLOE2E = []int{4}, 40, time.Microsecond })
	if s := stepAt(rep, "fake", 4); s.Attempts != 1 || s.Safe || s.SLO.Verdict != "fail" {
		t.Errorf("impossible SLO: attempts %d safe %v slo %+v", s.Attempts, s.Safe, s.SLO)
	}
}
