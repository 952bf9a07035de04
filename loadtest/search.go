package loadtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Verdict is what one run of one level showed.
type Verdict int

const (
	// Pass: the level is safe on this evidence.
	Pass Verdict = iota
	// Fail: the level is not safe (overflow, errors, KV above the ceiling,
	// SLO missed, over-saturated).
	Fail
	// Inconclusive: too few requests, or an SLO attainment whose confidence
	// interval straddles the target. The level is run again.
	Inconclusive
)

func (v Verdict) String() string {
	switch v {
	case Pass:
		return "safe"
	case Fail:
		return "unsafe"
	case Inconclusive:
		return "inconclusive"
	}
	return "verdict(" + strconv.Itoa(int(v)) + ")"
}

// Judgement is a judge's answer for one attempt at one level.
type Judgement struct {
	Verdict Verdict
	Reason  string // why it failed or is inconclusive; empty on Pass
}

// Judge runs attempt (0 for the first, 1 for the first re-run, …) at level
// and judges it. A re-run is expected to add to the evidence of the earlier
// attempts at that level, not replace it. An error stops the plan.
type Judge func(ctx context.Context, level float64, attempt int) (Judgement, error)

// Plan says which levels to run.
type Plan struct {
	// Levels is the fixed list, ascending, used when Search is false.
	Levels []float64
	// KeepGoing runs the whole list; by default a fixed sweep stops at its
	// first failing level, since everything above it is known to be worse.
	KeepGoing bool

	// Search doubles from Start (×Factor) until a level fails or Max passes,
	// then bisects between the last pass and the first fail until they are
	// within the tolerance.
	Search bool
	Start  float64 // first level; must be > 0
	Max    float64 // highest level tried; must be ≥ Start
	Factor float64 // growth while nothing has failed; 0 means 2
	// Tolerance: bisection stops when fail − pass ≤ max(Tolerance,
	// RelTolerance·pass). Integer levels never go below 1 apart.
	Tolerance    float64
	RelTolerance float64
	// Integer keeps levels whole (concurrency); false allows fractions (rate).
	Integer bool

	// MaxReruns is how many times an Inconclusive level is run again before
	// it is counted as failed (not proven safe). Negative means 0.
	MaxReruns int
}

// Trial is one attempt at one level, in the order run.
type Trial struct {
	Level   float64
	Attempt int
	Judgement
}

// SearchResult is what a plan found.
type SearchResult struct {
	Trials []Trial
	// Safe is the highest level that passed with every lower level run also
	// passing; HasSafe is false when none did.
	Safe    float64
	HasSafe bool
	// FirstFail is the lowest failing level, if any failed.
	FirstFail    float64
	HasFail      bool
	FailReason   string
	StopReason   string
	Interrupted  bool
	NonMonotonic []float64 // levels that passed above a failure (KeepGoing)
}

// Validate checks a plan, naming the field at fault.
func (p Plan) Validate() error {
	if !p.Search {
		if len(p.Levels) == 0 {
			return errors.New("plan: Levels is empty")
		}
		for i, l := range p.Levels {
			if !(l > 0) || (i > 0 && l <= p.Levels[i-1]) {
				return fmt.Errorf("plan: Levels must be positive and strictly ascending, got %v", p.Levels)
			}
		}
		return nil
	}
	if !(p.Start > 0) || math.IsInf(p.Start, 0) {
		return fmt.Errorf("plan: Start must be positive, got %g", p.Start)
	}
	if p.Integer && (p.Start != math.Trunc(p.Start) || p.Max != math.Trunc(p.Max)) {
		return fmt.Errorf("plan: integer Start and Max must be whole, got %g and %g", p.Start, p.Max)
	}
	if !(p.Max >= p.Start) || math.IsInf(p.Max, 0) {
		return fmt.Errorf("plan: Max (%g) must be at least Start (%g)", p.Max, p.Start)
	}
	if p.Factor != 0 && !(p.Factor > 1) {
		return fmt.Errorf("plan: Factor must be above 1, got %g", p.Factor)
	}
	if p.Tolerance < 0 || p.RelTolerance < 0 || p.RelTolerance >= 1 {
		return fmt.Errorf("plan: Tolerance must be ≥ 0 and RelTolerance in [0, 1), got %g and %g", p.Tolerance, p.RelTolerance)
	}
	if !p.Integer && p.Tolerance == 0 && p.RelTolerance == 0 {
		return errors.New("plan: a fractional search needs Tolerance or RelTolerance, or it never ends")
	}
	return nil
}

// Execute runs the plan against judge. It always ends: a fixed list has an
// end, a search doubles at most up to Max and then halves an interval that
// shrinks every step, and each level is run at most 1+MaxReruns times.
func Execute(ctx context.Context, p Plan, judge Judge) (SearchResult, error) {
	if err := p.Validate(); err != nil {
		return SearchResult{}, err
	}
	e := executor{p: p, judge: judge}
	var err error
	if p.Search {
		err = e.search(ctx)
	} else {
		err = e.sweep(ctx)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		e.out.Interrupted = true
		e.out.StopReason = "interrupted: " + err.Error()
		return e.out, nil
	}
	return e.out, err
}

type executor struct {
	p     Plan
	judge Judge
	out   SearchResult
}

// level runs one level to a Pass or a Fail, re-running Inconclusive ones.
func (e *executor) level(ctx context.Context, l float64) (bool, string, error) {
	reruns := max(e.p.MaxReruns, 0)
	var last Judgement
	for attempt := 0; attempt <= reruns; attempt++ {
		if err := ctx.Err(); err != nil {
			return false, "", err
		}
		j, err := e.judge(ctx, l, attempt)
		if err != nil {
			return false, "", err
		}
		e.out.Trials = append(e.out.Trials, Trial{Level: l, Attempt: attempt, Judgement: j})
		switch j.Verdict {
		case Pass:
			return true, "", nil
		case Fail:
			return false, j.Reason, nil
		}
		last = j
	}
	return false, fmt.Sprintf("not proven safe after %d attempts: %s", reruns+1, last.Reason), nil
}

func (e *executor) sweep(ctx context.Context) error {
	for i, l := range e.p.Levels {
		ok, why, err := e.level(ctx, l)
		if err != nil {
			return err
		}
		switch {
		case ok && !e.out.HasFail:
			e.out.Safe, e.out.HasSafe = l, true
		case ok:
			e.out.NonMonotonic = append(e.out.NonMonotonic, l)
		case !e.out.HasFail:
			e.out.FirstFail, e.out.HasFail, e.out.FailReason = l, true, why
			if !e.p.KeepGoing {
				if i < len(e.p.Levels)-1 {
					e.out.StopReason = fmt.Sprintf("stopped at the first failing level %s; %d higher levels not run", fmtLevel(l), len(e.p.Levels)-1-i)
				} else {
					e.out.StopReason = fmt.Sprintf("the last level %s failed", fmtLevel(l))
				}
				return nil
			}
		}
	}
	if e.out.HasFail {
		e.out.StopReason = fmt.Sprintf("ran every level; first failure at %s", fmtLevel(e.out.FirstFail))
	} else {
		e.out.StopReason = "ran every level; none failed"
	}
	return nil
}

func (e *executor) search(ctx context.Context) error {
	p := e.p
	factor := p.Factor
	if factor == 0 {
		factor = 2
	}
	// Double until something fails.
	l := p.Start
	for {
		ok, why, err := e.level(ctx, l)
		if err != nil {
			return err
		}
		if !ok {
			e.out.FirstFail, e.out.HasFail, e.out.FailReason = l, true, why
			break
		}
		e.out.Safe, e.out.HasSafe = l, true
		if l >= p.Max {
			e.out.StopReason = fmt.Sprintf("reached the search maximum %s without a failure", fmtLevel(p.Max))
			return nil
		}
		next := l * factor
		if p.Integer {
			next = max(math.Ceil(next), l+1)
		}
		l = min(next, p.Max)
	}
	if !e.out.HasSafe {
		e.out.StopReason = fmt.Sprintf("the lowest level %s failed", fmtLevel(l))
		return nil
	}
	// Bisect between the last pass and the first fail.
	for {
		lo, hi := e.out.Safe, e.out.FirstFail
		tol := max(p.Tolerance, p.RelTolerance*lo)
		if p.Integer {
			tol = max(tol, 1)
		}
		if hi-lo <= tol*(1+1e-9) {
			e.out.StopReason = fmt.Sprintf("bisected to within %s: %s passes, %s fails", fmtLevel(tol), fmtLevel(lo), fmtLevel(hi))
			return nil
		}
		mid := midpoint(lo, hi, p.Integer)
		ok, why, err := e.level(ctx, mid)
		if err != nil {
			return err
		}
		if ok {
			e.out.Safe = mid
		} else {
			e.out.FirstFail, e.out.FailReason = mid, why
		}
	}
}

// midpoint is strictly between lo and hi: whole for integer levels (callers
// guarantee hi−lo ≥ 2), else rounded to three significant figures when that
// stays inside, so reports read 3.75/s rather than 3.7499999/s.
func midpoint(lo, hi float64, integer bool) float64 {
	if integer {
		return math.Floor((lo + hi) / 2)
	}
	m := (lo + hi) / 2
	if r := roundSig(m, 3); r > lo && r < hi {
		return r
	}
	return m
}

func roundSig(x float64, digits int) float64 {
	if x == 0 {
		return 0
	}
	p := math.Pow(10, float64(digits)-math.Ceil(math.Log10(math.Abs(x))))
	return math.Round(x*p) / p
}

func fmtLevel(l float64) string { return strconv.FormatFloat(l, 'g', 6, 64) }
