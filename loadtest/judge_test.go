package loadtest

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func msd(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// okResult is a streamed success sent at start (s), first token after ttft
// and the end after e2e (ms), with n output tokens.
func okResult(start, ttft, e2e float64, n int, itl ...float64) Result {
	s := at(start)
	r := Result{Outcome: OutcomeOK, Start: s, FirstToken: s.Add(msd(ttft)), End: s.Add(msd(e2e)), OutputTokens: n, PromptTokens: 100}
	for _, g := range itl {
		r.ITL = append(r.ITL, msd(g))
	}
	return r
}

func handAttempt() attempt {
	return attempt{
		wallStart: at(0), wallEnd: at(2.5), measureStart: at(0), warmup: 3,
		results: []Result{
			okResult(0.0, 100, 1000, 10, 50, 70),
			okResult(0.2, 200, 1200, 20, 60),
			okResult(0.5, 300, 1500, 30),
			okResult(0.6, 400, 1400, 40), // ends at 2.0 s: the window's end
			{Outcome: OutcomeShed, Start: at(0.1), End: at(0.11), Err: "429 Too Many Requests: queue full"},
			{Outcome: OutcomeOverflow, Start: at(0.3), End: at(0.9), Err: "500: CUDA out of memory"},
			{Outcome: OutcomeTimeout, Start: at(0.4), End: at(1.9), Err: "no complete response within 1.5s"},
			{Outcome: OutcomeIncomplete, Start: at(1.0), End: at(2.5)},
		},
		warmupFailed: []Result{{Outcome: OutcomeOverflow, Err: "500: CUDA out of memory"}, {Outcome: OutcomeServerError, Err: "503: restarting"}},
		before: MetricsSample{HasKV: true, KVUsage: 0.9, KVSource: metricKVUsage, HasPreemptions: true, Preemptions: 10,
			HasOOM: true, HasKVPeak: true, KVPeak: 0.5, HasRunning: true, HasWaiting: true},
		hasBefore: true,
		series: []MetricsSample{
			{At: at(1), HasKV: true, KVUsage: 0.3, KVSource: metricKVUsage, Running: 4, Waiting: 1},
			{At: at(2), HasKV: true, KVUsage: 0.6, KVSource: metricKVUsage, Running: 6, Waiting: 3, NumGPUBlocks: 2048, BlockSize: 16},
		},
		after: MetricsSample{HasKV: true, KVUsage: 0.1, KVSource: metricKVUsage, HasPreemptions: true, Preemptions: 14,
			HasOOM: true, OOMEvents: 1, HasKVPeak: true, KVPeak: 0.8},
		hasAfter:       true,
		scrapeAttempts: 4,
	}
}

func TestAggregateHandComputed(t *testing.T) {
	g := &levelAgg{mode: ModeConcurrency, level: 8, target: "sim"}
	slo := sloLimits{ttft: 250 * time.Millisecond}
	g.add(handAttempt(), slo, "http://sim/metrics")
	s := g.report(slo, 0.99, 0.95)

	want := Counts{Sent: 8, Warmup: 3, WarmupOverflow: 1, WarmupFailed: 1, OK: 4, Shed: 1, Overflow: 1, Timeout: 1, Incomplete: 1}
	if s.Requests != want {
		t.Errorf("counts %+v, want %+v", s.Requests, want)
	}
	// Window: first counted send (0 s) to last counted end (2.0 s; the
	// incomplete one does not count).
	checks := []struct {
		name      string
		got, want float64
	}{
		{"window", s.WindowS, 2.0},
		{"wall", s.WallS, 2.5},
		{"req/s", s.RequestsPerS, 2},      // 4 ok / 2 s
		{"tok/s", s.OutputTokensPerS, 50}, // 100 tokens / 2 s
		{"mean output", s.MeanOutputTokens, 25},
		{"ttft p50", s.TTFT.P50, 250}, // 100,200,300,400: h = 1.5
		{"ttft p90", s.TTFT.P90, 370}, // h = 2.7
		{"ttft p99", s.TTFT.P99, 397}, // h = 2.97
		{"e2e p50", s.E2E.P50, 1300},  // 1000,1200,1400,1500
		{"e2e max", s.E2E.Max, 1500},
		{"itl p50", s.ITL.P50, 60},                                        // 50,60,70
		{"tpot p50", s.TPOT.P50, ((1500.0-300)/29 + (1200.0-200)/19) / 2}, // of 100, 52.6, 41.4, 25.6
		{"kv peak", s.KV.PeakUsage, 0.8},                                  // the server's own peak rose to 0.8
		{"kv mean", s.KV.MeanUsage, (0.3 + 0.6 + 0.1) / 3},
		{"preemptions", s.KV.Preemptions, 4},
		{"oom events", s.KV.OOMEvents, 1},
		{"peak running", s.KV.PeakRunning, 6},
		{"peak waiting", s.KV.PeakWaiting, 3},
		{"slo attainment", s.SLO.Attainment, 2.0 / 6}, // 2 of 4 ok + overflow + timeout
	}
	for _, c := range checks {
		if !near(c.got, c.want, 1e-9) {
			t.Errorf("%s = %g, want %g", c.name, c.got, c.want)
		}
	}
	if s.TTFT.N != 4 || s.ITL.N != 3 || s.SLO.Judged != 6 || s.SLO.Met != 2 || s.SLO.Verdict != "fail" {
		t.Errorf("n: ttft %d itl %d; slo %+v", s.TTFT.N, s.ITL.N, s.SLO)
	}
	if s.KV.NumGPUBlock != 2048 || len(s.KV.Curve) != 4 || s.KV.Curve[0].KVUsage != 0.9 || s.KV.Curve[1].T != 1 {
		t.Errorf("curve %+v blocks %d", s.KV.Curve, s.KV.NumGPUBlock)
	}
	if len(s.Errors) != 5 || s.Errors[0].Outcome != "warm-up overflow" {
		t.Errorf("error samples %+v", s.Errors)
	}

	// A re-run pools: counts add, windows add, the curve runs on.
	g.add(handAttempt(), slo, "http://sim/metrics")
	s = g.report(slo, 0.99, 0.95)
	if s.Attempts != 2 || s.Requests.OK != 8 || !near(s.WindowS, 4, 1e-9) || !near(s.RequestsPerS, 2, 1e-9) || s.KV.Preemptions != 8 {
		t.Errorf("pooled: attempts %d ok %d window %g req/s %g preemptions %g", s.Attempts, s.Requests.OK, s.WindowS, s.RequestsPerS, s.KV.Preemptions)
	}
	if last := s.KV.Curve[len(s.KV.Curve)-1]; !near(last.T, 5, 1e-9) {
		t.Errorf("second attempt's last point at %g s, want 5 (2.5 + 2.5)", last.T)
	}
}

func TestAggregateWithoutMetrics(t *testing.T) {
	g := &levelAgg{mode: ModeRate, level: 2.5}
	g.add(attempt{wallStart: at(0), wallEnd: at(1), measureStart: at(0), results: []Result{okResult(0, 10, 100, 5)}}, sloLimits{}, "")
	s := g.report(sloLimits{}, 0.99, 0.95)
	if s.KV != nil || s.SLO != nil || s.Rate != 2.5 || s.Concurrency != 0 {
		t.Errorf("kv %v slo %v rate %g conc %d", s.KV, s.SLO, s.Rate, s.Concurrency)
	}
	if len(s.Notes) != 1 || !strings.Contains(s.Notes[0], "no metrics URL") {
		t.Errorf("notes %v", s.Notes)
	}
}

func TestJudge(t *testing.T) {
	base := func() StepReport {
		return StepReport{Requests: Counts{Sent: 100, OK: 100}, KV: &KVReport{PeakUsage: 0.6}}
	}
	crit := criteria{ceiling: 0.75, minRequests: 20, timeout: time.Minute}
	for _, tc := range []struct {
		name    string
		edit    func(s *StepReport)
		verdict string
		reason  string
	}{
		{"clean", func(*StepReport) {}, "safe", ""},
		{"overflow", func(s *StepReport) { s.Requests.OK, s.Requests.Overflow = 97, 3 }, "unsafe", "overflow: 3 requests failed with out of memory"},
		{"server OOM events without failed requests", func(s *StepReport) { s.KV.OOMEvents = 1 }, "unsafe", "reported 1 out-of-memory events"},
		{"overflow in the warm-up", func(s *StepReport) { s.Requests.WarmupOverflow = 2 }, "unsafe", "overflow: 2 warm-up requests failed with out of memory"},
		{"warm-up failures", func(s *StepReport) { s.Requests.WarmupFailed = 1 }, "unsafe", "1 warm-up requests failed"},
		{"5xx", func(s *StepReport) { s.Requests.OK, s.Requests.Server5xx = 99, 1 }, "unsafe", "1 server errors (5xx)"},
		{"timeout", func(s *StepReport) { s.Requests.OK, s.Requests.Timeout = 99, 1 }, "unsafe", "timed out (over 1m0s)"},
		{"connection errors", func(s *StepReport) { s.Requests.OK, s.Requests.ConnError = 98, 2 }, "unsafe", "2 connection errors"},
		{"4xx", func(s *StepReport) { s.Requests.OK, s.Requests.Client4xx = 99, 1 }, "unsafe", "client errors"},
		{"KV above the ceiling", func(s *StepReport) { s.KV.PeakUsage = 0.76 }, "unsafe", "peak KV usage 76.0% above the limit 75%"},
		{"preemptions", func(s *StepReport) { s.KV.Preemptions = 9 }, "unsafe", "preemption: the server preempted 9 sequences"},
		// 9 preemptions with the pool at the limit (a full pool under
		// --max-kv-usage 1) and the SLO unsure: unsafe, not inconclusive.
		{"preemptions beat an unsure SLO", func(s *StepReport) {
			s.KV.Preemptions, s.KV.PeakUsage = 9, 0.75
			s.SLO = &SLOResult{Verdict: "inconclusive", Attainment: 0.95, Judged: 100, Low: 0.9, High: 0.98, Target: 0.95}
		}, "unsafe", "preemption: the server preempted 9 sequences"},
		{"KV at the ceiling is under it", func(s *StepReport) { s.KV.PeakUsage = 0.75 }, "safe", ""},
		{"KV not measured", func(s *StepReport) { s.KV = nil }, "safe", ""},
		{"shedding is not failing", func(s *StepReport) { s.Requests.OK, s.Requests.Shed = 40, 60 }, "safe", ""},
		{"everything shed", func(s *StepReport) { s.Requests.OK, s.Requests.Shed = 0, 100 }, "unsafe", "no request was served"},
		{"too few requests", func(s *StepReport) { s.Requests.Sent, s.Requests.OK = 12, 12 }, "inconclusive", "only 12 requests completed; at least 20"},
		{"a failure beats too few", func(s *StepReport) { s.Requests.Sent, s.Requests.OK, s.Requests.Overflow = 5, 4, 1 }, "unsafe", "overflow"},
		{"over-saturated", func(s *StepReport) {
			s.StoppedEarly, s.Saturation = stopSaturated, &SaturationVerdict{Saturated: true, Why: "over-saturated: TTFT rose from 1 s to 9 s"}
		}, "unsafe", "TTFT rose from 1 s to 9 s"},
		{"cut at max step time", func(s *StepReport) { s.StoppedEarly = stopMaxStepTime }, "unsafe", "maximum step time"},
		{"SLO proven", func(s *StepReport) {
			s.SLO = &SLOResult{Verdict: "pass", Attainment: 1, Low: 0.991, High: 1, Target: 0.99}
		}, "safe", ""},
		{"SLO missed", func(s *StepReport) {
			s.SLO = &SLOResult{Verdict: "fail", Attainment: 0.9, Low: 0.85, High: 0.94, Target: 0.99}
		}, "unsafe", "SLO attainment 90.0% (interval 85.0–94.0%) below the target 99.0%"},
		{"SLO unsure", func(s *StepReport) {
			s.SLO = &SLOResult{Verdict: "inconclusive", Attainment: 1, Judged: 100, Low: 0.963, High: 1, Target: 0.99}
		}, "inconclusive", "straddles the target 99.0%"},
	} {
		s := base()
		tc.edit(&s)
		judge(&s, crit)
		if s.Verdict != tc.verdict || s.Safe != (tc.verdict == "safe") {
			t.Errorf("%s: verdict %s safe %v, want %s (reasons %v)", tc.name, s.Verdict, s.Safe, tc.verdict, s.Reasons)
		}
		if tc.reason != "" && !slices.ContainsFunc(s.Reasons, func(r string) bool { return strings.Contains(r, tc.reason) }) {
			t.Errorf("%s: reasons %v lack %q", tc.name, s.Reasons, tc.reason)
		}
		if tc.verdict == "safe" && len(s.Reasons) != 0 {
			t.Errorf("%s: safe with reasons %v", tc.name, s.Reasons)
		}
	}
}

func TestAttainmentVerdictNeedsEnoughEvidence(t *testing.T) {
	// 100 of 100 within SLO cannot prove 99% at 95% confidence (the lower
	// bound is 97.4%); 300 of 300 can (99.1%); 95 of 100 is proven short.
	for _, tc := range []struct {
		met, n int
		want   string
	}{{100, 100, "inconclusive"}, {300, 300, "pass"}, {95, 100, "fail"}, {0, 0, "inconclusive"}} {
		g := &levelAgg{judged: tc.n, met: tc.met}
		s := g.report(sloLimits{ttft: time.Second}, 0.99, 0.95)
		if s.SLO.Verdict != tc.want {
			t.Errorf("%d of %d: %s [%.4f, %.4f], want %s", tc.met, tc.n, s.SLO.Verdict, s.SLO.Low, s.SLO.High, tc.want)
		}
	}
}

// Warm-up requests that finish inside the measured window are the server's
// work in that window: they count toward throughput (not latency), or a
// closed loop whose warm-up is still draining would be under-reported.
func TestThroughputCountsWarmupFinishedInWindow(t *testing.T) {
	a := handAttempt()
	a.measureStart = at(0.5)
	a.warmupOK = []finished{
		{end: at(0.4), outputTokens: 7},  // before the window: not counted
		{end: at(1.0), outputTokens: 11}, // inside
		{end: at(2.0), outputTokens: 13}, // at its end: inside
		{end: at(2.4), outputTokens: 17}, // after: not counted
	}
	g := &levelAgg{mode: ModeConcurrency, level: 8}
	g.add(a, sloLimits{}, "")
	s := g.report(sloLimits{}, 0.99, 0.95)
	// Window 0.5 s to 2.0 s; 4 counted ok (100 tokens) + 2 warm-ups (24).
	if !near(s.WindowS, 1.5, 1e-9) || !near(s.RequestsPerS, 6/1.5, 1e-9) || !near(s.OutputTokensPerS, 124/1.5, 1e-9) {
		t.Errorf("window %g, req/s %g, tok/s %g", s.WindowS, s.RequestsPerS, s.OutputTokensPerS)
	}
	if s.Requests.OK != 4 || s.MeanOutputTokens != 25 || s.TTFT.N != 4 {
		t.Errorf("warm-ups leaked into the counted figures: %+v, mean out %g, ttft n %d", s.Requests, s.MeanOutputTokens, s.TTFT.N)
	}
}
