package loadtest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// fakeJudge passes every level at or under capacity, except where script
// says otherwise for a given "level#attempt", and logs every call.
type fakeJudge struct {
	capacity float64
	script   map[string]Verdict
	calls    []string
	cancelAt string
	pass     func(level float64) bool
}

func (f *fakeJudge) judge(_ context.Context, level float64, attempt int) (Judgement, error) {
	key := fmt.Sprintf("%s#%d", fmtLevel(level), attempt)
	f.calls = append(f.calls, key)
	if key == f.cancelAt {
		return Judgement{}, context.Canceled
	}
	if v, ok := f.script[key]; ok {
		return Judgement{Verdict: v, Reason: "scripted " + v.String()}, nil
	}
	ok := level <= f.capacity
	if f.pass != nil {
		ok = f.pass(level)
	}
	if ok {
		return Judgement{Verdict: Pass}, nil
	}
	return Judgement{Verdict: Fail, Reason: fmt.Sprintf("over capacity at %s", fmtLevel(level))}, nil
}

func TestExecute(t *testing.T) {
	fixed := []float64{1, 2, 4, 8, 16}
	for _, tc := range []struct {
		name      string
		plan      Plan
		judge     fakeJudge
		calls     string // every attempt, in order
		safe      string // "" when none
		firstFail string // "" when none
		stop      string // substring of the stop reason
		failWhy   string
		nonMono   []float64
	}{
		{name: "sweep stops at first failure", plan: Plan{Levels: fixed}, judge: fakeJudge{capacity: 5},
			calls: "1#0 2#0 4#0 8#0", safe: "4", firstFail: "8", stop: "stopped at the first failing level 8; 1 higher levels not run",
			failWhy: "over capacity at 8"},
		{name: "sweep with keep-going notes a pass above a failure",
			plan: Plan{Levels: fixed, KeepGoing: true}, judge: fakeJudge{pass: func(l float64) bool { return l != 8 }},
			calls: "1#0 2#0 4#0 8#0 16#0", safe: "4", firstFail: "8", stop: "ran every level; first failure at 8", nonMono: []float64{16}},
		{name: "sweep where all pass", plan: Plan{Levels: fixed}, judge: fakeJudge{capacity: 100},
			calls: "1#0 2#0 4#0 8#0 16#0", safe: "16", stop: "ran every level; none failed"},
		{name: "sweep whose last level fails", plan: Plan{Levels: fixed}, judge: fakeJudge{capacity: 9},
			calls: "1#0 2#0 4#0 8#0 16#0", safe: "8", firstFail: "16", stop: "the last level 16 failed"},
		{name: "sweep where the first level fails", plan: Plan{Levels: fixed}, judge: fakeJudge{capacity: 0.5},
			calls: "1#0", firstFail: "1", stop: "stopped at the first failing level 1"},
		{name: "search doubles then bisects to one apart",
			plan:  Plan{Search: true, Start: 1, Max: 1024, Integer: true, Tolerance: 1},
			judge: fakeJudge{capacity: 37},
			calls: "1#0 2#0 4#0 8#0 16#0 32#0 64#0 48#0 40#0 36#0 38#0 37#0", safe: "37", firstFail: "38",
			stop: "bisected to within 1: 37 passes, 38 fails"},
		{name: "search tolerance stops the bisection early",
			plan:  Plan{Search: true, Start: 1, Max: 1024, Integer: true, Tolerance: 4},
			judge: fakeJudge{capacity: 37},
			calls: "1#0 2#0 4#0 8#0 16#0 32#0 64#0 48#0 40#0 36#0", safe: "36", firstFail: "40",
			stop: "bisected to within 4: 36 passes, 40 fails"},
		{name: "search relative tolerance",
			plan:  Plan{Search: true, Start: 4, Max: 1024, Integer: true, RelTolerance: 0.25},
			judge: fakeJudge{capacity: 37},
			calls: "4#0 8#0 16#0 32#0 64#0 48#0 40#0", safe: "32", firstFail: "40", stop: "bisected to within 8"},
		{name: "search reaches its maximum", plan: Plan{Search: true, Start: 1, Max: 100, Integer: true, Tolerance: 1},
			judge: fakeJudge{capacity: 1000},
			calls: "1#0 2#0 4#0 8#0 16#0 32#0 64#0 100#0", safe: "100", stop: "reached the search maximum 100 without a failure"},
		{name: "search whose start fails", plan: Plan{Search: true, Start: 1, Max: 64, Integer: true, Tolerance: 1},
			judge: fakeJudge{capacity: 0}, calls: "1#0", firstFail: "1", stop: "the lowest level 1 failed"},
		{name: "search with capacity one below a power of two",
			plan:  Plan{Search: true, Start: 1, Max: 64, Integer: true, Tolerance: 1},
			judge: fakeJudge{capacity: 7},
			calls: "1#0 2#0 4#0 8#0 6#0 7#0", safe: "7", firstFail: "8", stop: "7 passes, 8 fails"},
		{name: "inconclusive step is re-run and then passes",
			plan:  Plan{Levels: fixed, MaxReruns: 2},
			judge: fakeJudge{capacity: 5, script: map[string]Verdict{"4#0": Inconclusive}},
			calls: "1#0 2#0 4#0 4#1 8#0", safe: "4", firstFail: "8"},
		{name: "inconclusive step re-run to the limit counts as failed",
			plan:  Plan{Levels: fixed, MaxReruns: 2},
			judge: fakeJudge{capacity: 5, script: map[string]Verdict{"4#0": Inconclusive, "4#1": Inconclusive, "4#2": Inconclusive}},
			calls: "1#0 2#0 4#0 4#1 4#2", safe: "2", firstFail: "4",
			failWhy: "not proven safe after 3 attempts: scripted inconclusive"},
		{name: "no re-runs allowed", plan: Plan{Levels: fixed, MaxReruns: -1},
			judge: fakeJudge{capacity: 5, script: map[string]Verdict{"2#0": Inconclusive}},
			calls: "1#0 2#0", safe: "1", firstFail: "2"},
		{name: "a re-run that fails stops re-running",
			plan:  Plan{Search: true, Start: 1, Max: 64, Integer: true, Tolerance: 1, MaxReruns: 3},
			judge: fakeJudge{capacity: 100, script: map[string]Verdict{"8#0": Inconclusive, "8#1": Fail}},
			calls: "1#0 2#0 4#0 8#0 8#1 6#0 7#0", safe: "7", firstFail: "8"},
		{name: "rate search bisects to a relative tolerance",
			plan:  Plan{Search: true, Start: 1, Max: 64, RelTolerance: 0.1},
			judge: fakeJudge{capacity: 3.3},
			calls: "1#0 2#0 4#0 3#0 3.5#0 3.25#0", safe: "3.25", firstFail: "3.5", stop: "bisected to within 0.325"},
		{name: "interrupted mid-plan keeps what it had",
			plan: Plan{Levels: fixed}, judge: fakeJudge{capacity: 100, cancelAt: "8#0"},
			calls: "1#0 2#0 4#0 8#0", safe: "4", stop: "interrupted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Execute(context.Background(), tc.plan, tc.judge.judge)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(tc.judge.calls, " "); got != tc.calls {
				t.Errorf("calls:\n got %s\nwant %s", got, tc.calls)
			}
			if got := levelOrEmpty(out.Safe, out.HasSafe); got != tc.safe {
				t.Errorf("safe = %q, want %q", got, tc.safe)
			}
			if got := levelOrEmpty(out.FirstFail, out.HasFail); got != tc.firstFail {
				t.Errorf("first fail = %q, want %q", got, tc.firstFail)
			}
			if !strings.Contains(out.StopReason, tc.stop) {
				t.Errorf("stop reason %q, want it to contain %q", out.StopReason, tc.stop)
			}
			if tc.failWhy != "" && out.FailReason != tc.failWhy {
				t.Errorf("fail reason %q, want %q", out.FailReason, tc.failWhy)
			}
			if !slices.Equal(out.NonMonotonic, tc.nonMono) {
				t.Errorf("non-monotonic %v, want %v", out.NonMonotonic, tc.nonMono)
			}
			if len(out.Trials) != len(tc.judge.calls) && !out.Interrupted {
				t.Errorf("%d trials recorded for %d calls", len(out.Trials), len(tc.judge.calls))
			}
		})
	}
}

func levelOrEmpty(l float64, ok bool) string {
	if !ok {
		return ""
	}
	return fmtLevel(l)
}

func TestPlanValidate(t *testing.T) {
	for _, tc := range []struct {
		plan Plan
		want string
	}{
		{Plan{}, "Levels is empty"},
		{Plan{Levels: []float64{2, 1}}, "strictly ascending"},
		{Plan{Search: true, Start: 0, Max: 8}, "Start must be positive"},
		{Plan{Search: true, Start: 8, Max: 4, Integer: true}, "Max (4) must be at least Start (8)"},
		{Plan{Search: true, Start: 1.5, Max: 4, Integer: true}, "must be whole"},
		{Plan{Search: true, Start: 1, Max: 4, Factor: 1}, "Factor must be above 1"},
		{Plan{Search: true, Start: 1, Max: 4}, "never ends"},
	} {
		if err := tc.plan.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.plan, err, tc.want)
		}
	}
}

func TestMidpoint(t *testing.T) {
	for _, tc := range []struct {
		lo, hi  float64
		integer bool
		want    float64
	}{{32, 64, true, 48}, {36, 38, true, 37}, {3, 4, false, 3.5}, {3.25, 3.5, false, 3.38}, {1, 1.001, false, 1.0005}} {
		if got := midpoint(tc.lo, tc.hi, tc.integer); got != tc.want {
			t.Errorf("midpoint(%g, %g) = %g, want %g", tc.lo, tc.hi, got, tc.want)
		}
	}
}
