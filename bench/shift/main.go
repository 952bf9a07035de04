// Command shift measures whether the gateway keeps its promise — the GPU
// never overflows — when traffic departs from the history its forecast was
// learned on. Each scenario runs the gateway (reservation predicted unless
// --reservation says otherwise, every other key at its default) in front of
// an oom simulator whose pool is the budget, with
// closed-loop clients sending ~340-token prompts and max_tokens 2048:
//
//   - shift: outputs short (lognormal median 50) then, at the shift, every
//     request long (1000–2000 tokens);
//   - ramp: the long share grows from 0 to all of the traffic over the run;
//   - tenant / tenant-shares: tenant A (96 clients) turns long at the shift,
//     tenant B (32 clients) stays short; without and with `share: 0.5` each;
//   - min-tokens: 10 % of requests carry min_tokens 1500 from the start;
//   - heavy-tail: lognormal outputs with σ 1.2, half of them not streamed;
//   - hangup: 64 clients hang up on their running requests at once;
//   - json / responses: the shift on chat with response_format
//     json_object, and on streamed /v1/responses (streams that cannot be
//     resumed);
//   - merged-2, merged-4, merged-16 (and -steady, short answers only):
//     the simulator sends that many tokens an event (--stream-interval),
//     usage on every chunk; merged-random: 1 to 16 at random, no usage on
//     chunks (the gateway counts by bytes once it sees events short).
//   - dense-mix / dense-alone / dense-estimate: prompts dense in tokens
//     (code, JSON and digits, CJK, emoji; ~2400 bytes, 1000–1600 tokens)
//     from a quarter of the clients beside English or from all, sent in
//     turn to chat, completions, Responses and Messages (function tools on
//     all but completions), from a cold start, to a simulator without
//     /tokenize (404) or through tokenizer: estimate.
//   - two-tenant (not run by default): a batch tenant (class standard,
//     7/8 of the clients, max_tokens 1024) warms the gateway up alone on a
//     preempting simulator with outputs lognormal around 200 tokens; at the
//     change an interactive tenant (class critical, 1/8, max_tokens 256)
//     joins. A mix, not a shift: no drift trip, every answer a 200.
//     two-tenant-direct is the same traffic to the simulator alone (vLLM
//     alone); with both, it compares goodput and the interactive tenant's
//     p99 time to first token.
//
// Long answers are made by the simulator's --output-len-when: a request
// whose prompt carries a marker is drawn from the long distribution, so no
// field a gateway could read tells it apart — as a real model answers an
// essay question at length. The same long traffic through worst_case
// reservations is the goodput baseline after the shift.
//
//	go run ./bench/shift [--clients 128] [--time-scale 0.5] [--scenarios shift,ramp,...]
//
// It prints, per scenario, the simulator's out-of-memory events, requests
// the gateway stopped itself (share of those admitted after the shift),
// tenant B's losses, the guard's stops and how many were resumed, goodput
// windows, KV use and the learned p90, then the checks of the promise.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

const (
	model      = benchkit.Model
	longMarker = "LONGANSWER"
	maxTokens  = 2048
	// The simulator's pool at 0.9 of 24 GiB, and the gateway's ceiling at
	// the same 0.9: the budget is the whole pool.
	utilization = "0.9"
)

type options struct {
	*benchkit.Flags
	clients        int
	scenarios      string
	shiftAt, after time.Duration
	reservation    string
}

func main() {
	o := options{Flags: benchkit.Register(benchkit.Defaults{TimeScale: 0.5, Seed: 7, Draws: "the simulator and the clients", Out: true})}
	flag.IntVar(&o.clients, "clients", 128, "concurrent clients")
	flag.StringVar(&o.scenarios, "scenarios", "shift,ramp,tenant,tenant-shares,min-tokens,heavy-tail,hangup", "scenarios to run")
	flag.DurationVar(&o.shiftAt, "shift-at", 30*time.Second, "when the traffic changes")
	flag.DurationVar(&o.after, "after", 60*time.Second, "how long the run goes on after the change")
	flag.StringVar(&o.reservation, "reservation", "predicted", "admission.reservation of the gateway under test (predicted, worst_case)")
	flag.Parse()
	o.Main("shift", func(ctx context.Context, kit *benchkit.Kit) error { return run(ctx, kit, o) })
}

func run(ctx context.Context, kit *benchkit.Kit, o options) error {
	kit.Header(os.Stdout, "shift", fmt.Sprintf("%d clients, simulator time scale %g, change at %s, then %s", o.clients, o.TimeScale, o.shiftAt, o.after), "configs and logs")
	all := scenarios(o)
	var results []*result
	for _, name := range strings.Split(o.scenarios, ",") {
		sc, ok := all[name]
		if !ok {
			return fmt.Errorf("unknown scenario %q", name)
		}
		r, err := sc.run(ctx, o, kit)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		results = append(results, r)
		r.print(os.Stdout)
	}
	// The goodput baseline: the long traffic alone through worst_case.
	var base *result
	for _, r := range results {
		if r.sc.name == "shift" {
			b, err := (&scenario{name: "baseline", title: "long traffic only, reservation worst_case", reservation: "worst_case",
				long: func(int, time.Duration, *rand.Rand) bool { return true }}).run(ctx, o, kit)
			if err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			b.print(os.Stdout)
			base = b
		}
	}
	fmt.Println()
	checks(os.Stdout, o, results, base)
	var gw, direct *result
	for _, r := range results {
		switch r.sc.name {
		case "two-tenant":
			gw = r
		case "two-tenant-direct":
			direct = r
		}
	}
	if gw != nil && direct != nil {
		twoTenantChecks(os.Stdout, gw, direct)
		trips := gw.lastTrips()
		benchkit.Check(os.Stdout, trips != nil && trips["drift"] == 0, "two-tenant: no drift trip (%v)", trips)
		benchkit.Check(os.Stdout, gw.non200() == 0, "two-tenant: every answer a 200 (%d not)", gw.non200())
	}
	return nil
}

func checks(w io.Writer, o options, results []*result, base *result) {
	fmt.Fprintf(w, "Checks of the promise (it holds whatever the traffic does), reservation %s, oom simulator:\n", o.reservation)
	for _, r := range results {
		after := r.admittedAfter(r.changeAt)
		stoppedAfter := r.count(func(x record) bool { return x.start >= r.changeAt && x.outcome == stopped })
		benchkit.Check(w, r.overflow == 0, "%s: zero overflow events (%.0f)", r.sc.name, r.overflow)
		benchkit.Check(w, after > 0 && float64(stoppedAfter) <= 0.02*float64(after), "%s: stopped by the gateway %d of %d admitted after the change (≤ 2%%)", r.sc.name, stoppedAfter, after)
		if r.sc.dense != nil {
			failed := r.count(func(x record) bool { return x.outcome != ok && x.outcome != canceled })
			benchkit.Check(w, failed == 0, "%s: every answer a 200 (%d not)", r.sc.name, failed)
			if over := overReserved(r.promptsAt, r.promptsEnd, "en"); r.sc.name != "dense-alone" {
				benchkit.Check(w, over >= 0 && over <= 0.15, "%s: English prompts over-reserved by %.1f%% after calibration (0–15 %%)", r.sc.name, 100*over)
			}
		} else if r.sc.tenantOf != nil && r.sc.maxTokens == nil {
			lostB := r.count(func(x record) bool { return x.tenant == "b" && (x.outcome == oom || x.outcome == stopped) })
			benchkit.Check(w, lostB == 0 && r.count(func(x record) bool { return x.tenant == "b" && x.outcome == ok }) > 0, "%s: tenant B loses no request (%d)", r.sc.name, lostB)
		}
		if r.sc.name == "shift" && base != nil {
			s := r.shiftAt
			g := r.goodput(s+30*time.Second, s+60*time.Second)
			bg := base.goodput(s, s+30*time.Second)
			benchkit.Check(w, bg > 0 && g >= 0.9*bg, "shift: goodput 30–60s after the change %.0f tok/s, %.2f× worst_case's on the long traffic (%.0f; ≥ 0.9×)", g, g/math.Max(bg, 1), bg)
			p, want := r.p90At(s+30*time.Second), r.longP90()
			benchkit.Check(w, p > 0 && want > 0 && float64(p) <= 2*float64(want) && 2*float64(p) >= float64(want),
				"shift: learned p90 %d within 2× of the long answers' %d 30s after the change", p, want)
		}
	}
}
