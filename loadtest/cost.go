package loadtest

import (
	"fmt"
	"math"
)

// Cost is what a step, or a target at its safe level, costs at the
// target's price per hour: operators compare GPUs by the full cost of a
// job, not by throughput alone.
type Cost struct {
	// PerMillionOutputTokens is the price of the time it takes to generate
	// a million output tokens at the step's throughput; nil when the step
	// generated nothing (no price would be honest).
	PerMillionOutputTokens *float64 `json:"per_million_output_tokens"`
	// Run is the price of the step's wall time (warm-up, retries and
	// re-runs included): what running it cost.
	Run float64 `json:"run"`
}

// stepCost prices s at pricePerHour.
func stepCost(pricePerHour float64, s *StepReport) *Cost {
	c := &Cost{Run: pricePerHour * s.WallS / 3600}
	if s.OutputTokensPerS > 0 {
		v := pricePerHour / (s.OutputTokensPerS * 3600) * 1e6
		c.PerMillionOutputTokens = &v
	}
	return c
}

// price fills the costs of t's steps, of its safe level and of its run.
func (t *TargetReport) price() {
	t.CostAtSafe, t.RunCost = nil, 0
	if t.PricePerHour <= 0 {
		return
	}
	for _, s := range t.steps {
		s.Cost = stepCost(t.PricePerHour, s)
		t.RunCost += s.Cost.Run
	}
	if t.HasSafe {
		if s := t.step(t.Safe); s != nil {
			t.CostAtSafe = s.Cost
		}
	}
}

// fmtMoney prints an amount in no particular currency with the precision a
// comparison needs: cents from 1 up, two significant digits below, never in
// exponent form.
func fmtMoney(v float64) string {
	switch {
	case math.IsInf(v, 0) || math.IsNaN(v):
		return "-"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.2f", v)
	case v <= 0:
		return "0"
	}
	digits := min(1-int(math.Floor(math.Log10(v))), 12)
	return fmt.Sprintf("%.*f", digits, v)
}

// costCells are a step's cost per million output tokens and run cost as
// table cells, "-" where unknown.
func costCells(s *StepReport) (perMTok, run string) {
	if s.Cost == nil {
		return "-", "-"
	}
	perMTok = "-"
	if s.Cost.PerMillionOutputTokens != nil {
		perMTok = fmtMoney(*s.Cost.PerMillionOutputTokens)
	}
	return perMTok, fmtMoney(s.Cost.Run)
}

// priced says whether any target of r has a price.
func (r *Report) priced() bool {
	for _, t := range r.Targets {
		if t.PricePerHour > 0 {
			return true
		}
	}
	return false
}
