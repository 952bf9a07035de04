package loadtest

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTable writes the results table: one row a step, by target and
// level, with the columns ops read first. A target column appears
// only when several targets were compared.
func WriteTable(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	multi := len(r.Targets) > 1
	priced := r.priced()
	level := "conc"
	if r.Mode == ModeRate {
		level = "rate/s"
	}
	if multi {
		fmt.Fprint(tw, "target\t")
	}
	fmt.Fprintf(tw, "%s\treq/s\tout tok/s\ttot tok/s\tttft mean\tttft p50\tttft p90\tttft p99\titl p50\titl p99\te2e mean\te2e p50\te2e p90\te2e p99\tok\t429\tfailed\toom\tkv peak\tpreempt\tslo met\t", level)
	if priced {
		fmt.Fprint(tw, "cost/Mtok\trun cost\t")
	}
	fmt.Fprint(tw, "verdict\t\n")
	for i := range r.Steps {
		s := &r.Steps[i]
		if multi {
			fmt.Fprintf(tw, "%s\t", s.Target)
		}
		kv, pre := "n/a", "n/a"
		if s.KV != nil {
			kv, pre = fmt.Sprintf("%.1f%%", 100*s.KV.PeakUsage), fmt.Sprintf("%.0f", s.KV.Preemptions)
		}
		slo := "-"
		if s.SLO != nil {
			slo = fmt.Sprintf("%.1f%%", 100*s.SLO.Attainment)
		}
		verdict := s.Verdict
		if s.Attempts > 1 {
			verdict += fmt.Sprintf(" (%d runs)", s.Attempts)
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t",
			fmtLevel(s.Level), s.RequestsPerS, s.OutputTokensPerS, s.TotalTokensPerS,
			fmtStat(s.TTFT, s.TTFT.Mean), fmtMsOrDash(s.TTFT), fmtStat(s.TTFT, s.TTFT.P90), fmtP99OrDash(s.TTFT),
			fmtMsOrDash(s.ITL), fmtP99OrDash(s.ITL),
			fmtStat(s.E2E, s.E2E.Mean), fmtMsOrDash(s.E2E), fmtStat(s.E2E, s.E2E.P90), fmtP99OrDash(s.E2E),
			s.Requests.OK, s.Requests.Shed, s.Requests.Failed(), s.Requests.Overflow+s.Requests.WarmupOverflow, kv, pre, slo)
		if priced {
			perMTok, run := costCells(s)
			fmt.Fprintf(tw, "%s\t%s\t", perMTok, run)
		}
		fmt.Fprintf(tw, "%s\t\n", verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i := range r.Steps {
		s := &r.Steps[i]
		if len(s.Reasons) == 0 {
			continue
		}
		prefix := ""
		if multi {
			prefix = s.Target + " "
		}
		if _, err := fmt.Fprintf(w, "  %s%s %s: %s\n", prefix, levelName(r.Mode), fmtLevel(s.Level), joinReasons(s.Reasons)); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "\n%s\n", r.Answer)
	return err
}

func levelName(m Mode) string {
	if m == ModeRate {
		return "rate"
	}
	return "concurrency"
}

func fmtMsOrDash(s Summary) string {
	if s.N == 0 {
		return "-"
	}
	return fmtMs(s.P50)
}

// fmtStat is one of s's statistics, v, or "-" when s is empty.
func fmtStat(s Summary, v float64) string {
	if s.N == 0 {
		return "-"
	}
	return fmtMs(v)
}

func fmtP99OrDash(s Summary) string {
	if s.N == 0 {
		return "-"
	}
	return fmtMs(s.P99)
}
