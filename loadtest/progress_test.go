package loadtest

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestBarLine(t *testing.T) {
	info := StepInfo{Target: "sim", Mode: ModeConcurrency, Level: 16, Attempt: 1}
	line := barLine(info, ProgressSnapshot{Done: 25, Total: 100, OK: 24, Failed: 1, InFlight: 16, KVUsage: 0.42, HasKV: true, Elapsed: 1500 * time.Millisecond}, 20)
	for _, want := range []string{"sim c=16 (re-run 1)", "█████░░░░░░░░░░░░░░░", " 25%", "25/100 done", "ok 24", "fail 1", "in flight 16", "kv  42%", "1.5s"} {
		if !strings.Contains(line, want) {
			t.Errorf("bar %q lacks %q", line, want)
		}
	}
	// Time-bound: the bar follows the clock.
	line = barLine(StepInfo{Target: "x", Mode: ModeRate, Level: 2.5}, ProgressSnapshot{Duration: 10 * time.Second, Elapsed: 5 * time.Second, Done: 3}, 10)
	if !strings.Contains(line, "x rate=2.5/s █████░░░░░  50%") || !strings.Contains(line, "3/? done") {
		t.Errorf("time-bound bar %q", line)
	}
}

func TestProgressWriters(t *testing.T) {
	rep := &StepReport{Verdict: "unsafe", Requests: Counts{OK: 9, Overflow: 1}, Reasons: []string{"overflow: 1 requests failed with out of memory"}}
	info := StepInfo{Target: "sim", Mode: ModeConcurrency, Level: 8, Requests: 10}
	var lines bytes.Buffer
	p := NewLineProgress(&lines)
	p.StepStart(info)
	p.StepUpdate(info, ProgressSnapshot{Done: 5})
	p.StepDone(info, rep)
	want := "step sim c=8: started, 10 requests\nstep sim c=8: unsafe — 9 ok, 1 failed, 0 shed, 0.00 req/s, p99 ttft -, p99 e2e -, kv n/a (overflow: 1 requests failed with out of memory)\n"
	if lines.String() != want {
		t.Errorf("lines:\n%q\nwant\n%q", lines.String(), want)
	}
	var bar bytes.Buffer
	p = NewBarProgress(&bar)
	p.StepStart(info)
	p.StepUpdate(info, ProgressSnapshot{Done: 5, Total: 10})
	p.StepDone(info, rep)
	out := bar.String()
	if strings.Count(out, "\r\033[K") != 3 || !strings.HasSuffix(out, "kv n/a (overflow: 1 requests failed with out of memory)\n") {
		t.Errorf("bar output %q", out)
	}
}

// The whole run's place: step k of N, time in, and time left at the pace
// of the steps done; a search's count is open.
func TestRunProgress(t *testing.T) {
	for _, tc := range []struct {
		info StepInfo
		want string
	}{
		{StepInfo{}, ""},
		{StepInfo{Step: 1, Steps: 10}, "step 1/10, 0s in"},
		{StepInfo{Step: 3, Steps: 10, RunElapsed: 80 * time.Second}, "step 3/10, 1m20s in, ~5m20s left"},
		{StepInfo{Step: 4, RunElapsed: 90 * time.Second}, "step 4, 1m30s in"},
	} {
		if got := tc.info.runPart(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.info, got, tc.want)
		}
	}
	info := StepInfo{Target: "sim", Mode: ModeConcurrency, Level: 8, Requests: 10, Step: 2, Steps: 4, RunElapsed: time.Minute}
	var lines bytes.Buffer
	NewLineProgress(&lines).StepStart(info)
	if want := "step sim c=8: started, 10 requests [step 2/4, 1m0s in, ~3m0s left]\n"; lines.String() != want {
		t.Errorf("line %q, want %q", lines.String(), want)
	}
	if bar := barLine(info, ProgressSnapshot{Done: 5, Total: 10}, 10); !strings.HasSuffix(bar, "[step 2/4, 1m0s in, ~3m0s left]") {
		t.Errorf("bar %q", bar)
	}
}
