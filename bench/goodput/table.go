package main

import (
	"fmt"
	"io"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// printTable prints a workload's rows, each rated against the first; paired
// (a comparison of two builds, rows in pairs: this build, then the
// baseline) rates both rows of a pair against the baseline's.
func printTable(w io.Writer, wl *workload, rows []row, paired bool) {
	fmt.Fprintf(w, "Workload %s: %s; %s\n", wl.name, wl.title, wl.promptNote)
	rel := "×best"
	switch {
	case paired:
		rel = "×base"
	case wl.limit > 0:
		rel = "×count"
	}
	fmt.Fprintf(w, "%-26s %-24s %6s %10s %7s %8s %7s %8s %8s %6s %6s %6s\n",
		"configuration", "", "conc", "goodput", rel, "KV mean", "KV peak", "overflow", "preempt", "ok", "429", "failed")
	for i, r := range rows {
		base := rows[0].Goodput
		if paired {
			// This build's row against the baseline's row after it.
			base = rows[i|1].Goodput
		}
		fmt.Fprintf(w, "%-26s %-24s %6d %10.0f %6.2f× %7.1f%% %6.1f%% %8.0f %8.0f %6d %6d %6d\n",
			r.name, r.note, r.Level, r.Goodput, r.Goodput/base, 100*r.KVMean, 100*r.KVPeak, r.Overflow, r.Preemptions, r.OK, r.Shed, r.Failed)
	}
	fmt.Fprintln(w, "goodput: output tokens/s of answered requests; KV mean: the simulator's KV use (share of its pool, = the gateway's budget) from 20% to 80% of the step's time; overflow: the simulator's out-of-memory events")
}

// find is the row of that name (and note, when not ""), nil when absent.
func find(rows []row, name, note string) *row {
	for i := range rows {
		if rows[i].name == name && (note == "" || rows[i].note == note) {
			return &rows[i]
		}
	}
	return nil
}

// printPrefixChecks states the acceptance bars of the prefix workloads:
// the gateway (predicted, sharing prompt blocks) against vLLM alone and,
// on shared-prefix, against itself counting every prompt whole.
func printPrefixChecks(w io.Writer, wl *workload, rows []row) {
	pred, off := find(rows, "gateway predicted", ""), find(rows, "gateway predicted", "prefix_caching: off")
	pre := find(rows, "direct, vLLM preempt", "")
	if pred == nil || off == nil || pre == nil {
		return
	}
	var overflow float64
	var overflowed int
	for _, r := range rows[:len(rows)-1] { // the gateway's rows
		overflow += r.Overflow
		overflowed += r.Overflowed
	}
	check := func(ok bool, format string, a ...any) { benchkit.Check(w, ok, format, a...) }
	fmt.Fprintf(w, "Acceptance, %s workload (gateway predicted, prompt blocks shared):\n", wl.name)
	check(overflow == 0 && overflowed == 0, "zero overflow on the oom simulator behind the gateway, every configuration (%.0f events, %d answers)", overflow, overflowed)
	switch wl.name {
	case "shared-prefix":
		check(pred.Failed == 0 && pred.Shed == 0, "every answer a 200 (%d sheds, %d failures)", pred.Shed, pred.Failed)
		check(pred.KVMean >= 0.85, "real KV use %.1f%% of the pool over the saturated part (≥ 85%%)", 100*pred.KVMean)
		check(pred.Goodput >= 0.95*pre.Goodput, "gateway %.0f%% of vLLM alone with its prefix cache (≥ 95%%)", 100*pred.Goodput/pre.Goodput)
		check(pred.Goodput >= 3*off.Goodput, "gateway %.2f× itself with prefix_caching: off (≥ 3×)", pred.Goodput/off.Goodput)
	case "chat":
		check(pred.Goodput >= 0.9*pre.Goodput, "gateway %.0f%% of vLLM alone with its prefix cache (≥ 90%%)", 100*pred.Goodput/pre.Goodput)
	}
}

// printChecks states the bars kvgate holds itself to against the
// early-stop table.
func printChecks(w io.Writer, rows []row) {
	best, worst := find(rows, "direct, best safe limit", ""), find(rows, "gateway worst_case", "")
	pred, predPre := find(rows, "gateway predicted", "oom simulator"), find(rows, "gateway predicted", "preempt simulator")
	pre, unb := find(rows, "direct, vLLM preempt", ""), find(rows, "unbounded pool", "")
	if best == nil || worst == nil || pred == nil || predPre == nil || pre == nil || unb == nil {
		return
	}
	check := func(ok bool, format string, a ...any) { benchkit.Check(w, ok, format, a...) }
	fmt.Fprintln(w, "Checks (fill the pool), predicted reservations, early-stopping workload:")
	check(pred.KVMean >= 0.85, "real KV use %.1f%% of the budget over the saturated part (≥ 85%%)", 100*pred.KVMean)
	check(pred.Overflow == 0 && predPre.Overflow == 0, "zero overflow on the oom simulator (%.0f)", pred.Overflow)
	check(predPre.PreemptedPct <= 1, "preemptions on the preempt simulator %.0f, %.2f%% of requests (≤ 1%%)", predPre.Preemptions, predPre.PreemptedPct)
	check(pred.Failed == 0 && pred.Shed == 0, "every answer a 200 (%d sheds, %d failures)", pred.Shed, pred.Failed)
	check(pred.Goodput >= 1.3*worst.Goodput, "predicted %.2f× worst_case (≥ 1.3×)", pred.Goodput/worst.Goodput)
	check(pred.Goodput >= 1.6*best.Goodput, "gateway %.2f× the best safe limit straight at the simulator (≥ 1.6×)", pred.Goodput/best.Goodput)
	check(pred.Goodput >= 0.95*pre.Goodput, "gateway %.0f%% of vLLM's preempt mode driven directly (≥ 95%%)", 100*pred.Goodput/pre.Goodput)
	check(pred.Goodput >= 0.8*unb.Goodput, "gateway %.0f%% of the unbounded pool (≥ 80%%)", 100*pred.Goodput/unb.Goodput)
}
