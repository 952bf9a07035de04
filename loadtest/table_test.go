package loadtest

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The table has the columns benchmark_serving, genai-perf and guidellm
// users look for: mean and p90 beside the median and p99, and total-token
// throughput beside the output tokens'.
func TestTableColumns(t *testing.T) {
	step := StepReport{Target: "sim", Mode: ModeConcurrency, Level: 8, Attempts: 1, Verdict: "safe",
		RequestsPerS: 2, OutputTokensPerS: 256, TotalTokensPerS: 2560,
		TTFT:     Summary{N: 4, Mean: 150, P50: 120, P90: 310, P99: 450},
		ITL:      Summary{N: 4, P50: 16, P99: 28},
		E2E:      Summary{N: 4, Mean: 2100, P50: 2000, P90: 2900, P99: 3300},
		Requests: Counts{Sent: 4, OK: 4}}
	var b bytes.Buffer
	if err := WriteTable(&b, &Report{Mode: ModeConcurrency, Steps: []StepReport{step}}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	head, row := lines[0], lines[1]
	for _, want := range []string{"out tok/s  tot tok/s", "ttft mean  ttft p50  ttft p90  ttft p99", "e2e mean  e2e p50  e2e p90  e2e p99"} {
		if !strings.Contains(head, want) {
			t.Errorf("header %q lacks %q", head, want)
		}
	}
	cells := strings.Join(strings.Fields(row), " ")
	for _, want := range []string{"256 2560", "150 ms 120 ms 310 ms 450 ms", "2.10 s 2.00 s 2.90 s 3.30 s"} {
		if !strings.Contains(cells, want) {
			t.Errorf("row %q lacks %q", row, want)
		}
	}
}

// Total-token throughput counts the prompts of the requests the output
// throughput counts, over the same window.
func TestTotalTokenThroughput(t *testing.T) {
	var g levelAgg
	start := time.Unix(1000, 0)
	a := attempt{measureStart: start, results: []Result{
		{Outcome: OutcomeOK, Start: start, End: start.Add(2 * time.Second), PromptTokens: 100, OutputTokens: 10},
		{Outcome: OutcomeOK, Start: start, End: start.Add(4 * time.Second), PromptTokens: 300, OutputTokens: 30},
	}}
	g.add(a, sloLimits{}, "")
	s := g.report(sloLimits{}, 0.9, 0.95)
	if s.OutputTokensPerS != 10 || s.TotalTokensPerS != 110 {
		t.Errorf("output %v tok/s, total %v tok/s; want 10 and 110", s.OutputTokensPerS, s.TotalTokensPerS)
	}
}
