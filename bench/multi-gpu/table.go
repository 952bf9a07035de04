package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

func printTable(w io.Writer, o options, rows []*result) {
	fmt.Fprintf(w, "Llama-3-8B on simulated 24 GiB GPUs (pool at 0.9, ceiling 0.9, --on-overflow oom); prompts 90%% ≈256, 10%% ≈4000 tokens;\n")
	fmt.Fprintf(w, "outputs lognormal (median 200, σ 0.8) under max_tokens %d; a pool holds %.0f requests at their worst case, the clients are %.1f× that\n",
		maxTokens, rows[0].poolFit, float64(o.perBackend)/rows[0].poolFit)
	fmt.Fprintf(w, "%-26s %5s %7s %9s %6s %10s %8s %7s %8s %6s %5s %5s %6s %5s\n",
		"configuration", "GPUs", "clients", "goodput", "×one", "whole step", "KV mean", "KV peak", "overflow", "ok", "429", "503", "failed", "load")
	base := rows[0].goodput
	for _, r := range rows {
		gpus := strconv.Itoa(r.backends)
		if r.kill {
			gpus = fmt.Sprintf("%d→%d", r.backends, r.backends-1)
		}
		fmt.Fprintf(w, "%-26s %5s %7d %9.0f %5.2f× %10.0f %7.1f%% %6.1f%% %8.0f %6d %5d %5.0f %6d %5s\n",
			r.name, gpus, r.clients, r.goodput, r.goodput/base, r.step.Goodput, 100*r.kvMean, 100*r.kvPeak,
			r.overflow, r.step.OK, r.step.Shed, r.noBackend, r.step.Failed, r.load)
	}
	fmt.Fprintln(w, "goodput: answered output tokens/s over the saturated window (the gateway's count; after the kill for the last row);")
	fmt.Fprintln(w, "whole step: kvgate loadtest's figure, first request sent to last answered; KV: the simulators' own use of their pools;")
	fmt.Fprintln(w, "overflow: the simulators' out-of-memory events (or answers failed by one, if more); failed: every answer neither 200 nor 429 (the 503s among them);")
	fmt.Fprintln(w, "load: the machine's 1-minute load average as the configuration's run ended")
}

// printChecks states the bars kvgate holds itself to; it returns whether
// all passed.
func printChecks(w io.Writer, rows []*result) bool {
	one, all, killed := rows[0], rows[1], rows[2]
	ok := true
	check := func(pass bool, format string, a ...any) { ok = benchkit.Check(w, pass, format, a...) && ok }
	fmt.Fprintln(w, "Checks (many backends, one queue):")
	check(all.goodput >= 2.8*one.goodput, "goodput with %d backends %.2f× one backend over the saturated window (≥ 2.8×); %.2f× over the whole step",
		all.backends, all.goodput/one.goodput, all.step.Goodput/one.step.Goodput)
	check(one.overflow == 0 && all.overflow == 0, "zero overflow with one backend (%.0f) and with %d (%.0f)", one.overflow, all.backends, all.overflow)
	check(killed.overflow == 0, "zero overflow with one of %d killed (%.0f)", killed.backends, killed.overflow)
	check(killed.queueTimeouts == 0 && killed.noRouteSlow == 0,
		"no request waited for the dead GPU: %.0f queue timeouts; %.0f waiters refused for want of a backend, %.0f of them after more than a second; %.0f answered 503 no_healthy_backend",
		killed.queueTimeouts, killed.noRouteWaits, killed.noRouteSlow, killed.noBackend)
	check(killed.noticed >= 0 && killed.boundAfter == 0,
		"the dead GPU left routing %.2f s after the SIGKILL and took no request from a second after that (%.0f; %.0f bound in the moment before, each moved); %d requests moved to another GPU before their first byte, %.0f streams cut by the kill",
		killed.noticed.Seconds(), killed.boundAfter, killed.boundAround, killed.moved, killed.lostMidStream)
	check(killed.goodput >= 1.8*one.goodput, "goodput after the kill %.2f× one backend (≥ 1.8×), from the kill at %.1f s to %.1f s",
		killed.goodput/one.goodput, killed.killedAt.Seconds(), killed.window[1].Seconds())
	return ok
}
