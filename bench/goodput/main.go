// Command goodput measures what kvgate's admission policies get out of one
// simulated GPU, side by side with what users would otherwise run, in one
// run: the simulator straight at a sweep of concurrency limits (the best one
// that never overflowed is what a fixed limit gives), the gateway with that
// limit (admission.mode count), with worst-case reservations, and with
// predicted ones (the default), vLLM's own preempt mode driven directly, and
// the same simulator with a pool too large to fill (what no scheduler can
// beat). The prefix workloads (shared-prefix, chat), whose requests share
// their leading prompt blocks, are measured instead against vLLM alone with
// its prefix cache and against the gateway counting every prompt whole
// (backends[].prefix_caching: off), beside the fixed limit that fits the
// pool at worst case and both reservation policies. It prints one table
// per workload: goodput (output tokens per second of answered requests),
// real KV use over the saturated part of the run and at its peak, overflow
// events, preemptions, sheds and failures; then the acceptance checks
// against it.
//
//	go run ./bench/goodput [--requests 1500] [--warmup 0] [--clients 128] [--time-scale 0.5] [--sweep 8..32+4] [--workloads early-stop,fixed,shared-prefix,chat]
//
// The time scale is set so that the engine model, not the machine, is the
// limit: the simulator, the gateway and the load generator share the
// machine's cores, and at 0.25 on two of them the fastest configurations
// (the unbounded pool, the predicted policy) were capped by CPU below what
// the engine allows, pressing every ratio toward 1.
//
// --warmup sends that many uncounted requests first, to every configuration
// alike. A gateway with predicted reservations holds a model's requests at
// their worst case until warmup_samples (100) of them have finished: about
// nine seconds on the prefix workloads, in steps of about fifty at 800
// requests, so without it a table measures that cold start as much as the
// steady state. The cold start is a gateway's cost at every restart; the
// steady state is what it runs at between them.
//
// --baseline BIN compares two builds of the gateway in one run: only the
// gateway rows with reservations are measured (no sweep, no vLLM rows), each
// twice over a fresh simulator of its own, first with this build and then
// with BIN, so that both see the same load, seed and machine; the ratio
// column is then each row against the row before it.
//
// It builds kvgate, starts every simulator and gateway as a process of its
// own on free loopback ports, and drives them with kvgate loadtest.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// The simulated GPU: Llama-3-8B on 24 GiB, its pool at vLLM's default
// utilization 0.9 (2888 blocks of 16 tokens, 46k tokens), the gateway's
// ceiling at the same 0.9 so that its budget is the whole pool.
const (
	model       = benchkit.Model
	utilization = "0.9"
)

type options struct {
	*benchkit.Flags
	requests, clients, warmup int
	sweep, workloads          string
	// predicted is more admission keys for the rows with predicted
	// reservations, to weigh a setting (epsilon, headroom) side by side.
	predicted string
	// baseline is a second kvgate build whose gateway rows run beside
	// this build's (--baseline); its kit, set by run, starts only gateways.
	baseline string
	base     *benchkit.Kit
}

func main() {
	o := options{Flags: benchkit.Register(benchkit.Defaults{TimeScale: 0.5, Seed: 7, Draws: "the prompt and output lengths", Out: true})}
	flag.IntVar(&o.requests, "requests", 1500, "requests per measured step")
	flag.IntVar(&o.warmup, "warmup", 0, "uncounted requests at the start of every step, for every configuration alike (0: one per client); a gateway holds a model's requests at their worst case until it has seen warmup_samples of them finish, so a small step measures that cold start too")
	flag.IntVar(&o.clients, "clients", 128, "concurrent clients of the saturated steps (at least 4× what the pool holds at worst case)")
	flag.StringVar(&o.sweep, "sweep", "8..32+4", "concurrency limits tried straight at the simulator")
	flag.StringVar(&o.workloads, "workloads", "early-stop,fixed", "workloads to run: early-stop (lognormal outputs stopping early), fixed (outputs of 128 or 512), shared-prefix (one 2k-token system prompt, 80–120 tokens of each request's own), chat (4-turn sessions re-sending their history after a shared 1k-token system prompt)")
	flag.StringVar(&o.predicted, "predicted", "", "more admission keys for the predicted rows, as YAML flow items (e.g. 'epsilon: 1e-2, headroom: 0.01')")
	flag.StringVar(&o.baseline, "baseline", "", "a second kvgate binary (another build): measure only the gateway rows with reservations, each with this build and then with that one, side by side")
	flag.Parse()
	o.Main("goodput", func(ctx context.Context, kit *benchkit.Kit) error { return run(ctx, kit, o) })
}

func run(ctx context.Context, kit *benchkit.Kit, o options) error {
	kit.Header(os.Stdout, "goodput", fmt.Sprintf("%d requests a step after %s, %d clients, simulator time scale %g", o.requests, warmupText(o), o.clients, o.TimeScale), "reports and logs")
	if o.baseline != "" {
		// Only gateways start from the baseline build: the simulators and
		// the load generator are this build's for both rows of a pair.
		o.base = &benchkit.Kit{Bin: o.baseline, Dir: kit.Dir}
		defer o.base.StopAll()
		fmt.Printf("baseline: every gateway row again with %s\n\n", o.baseline)
	}
	for _, w := range strings.Split(o.workloads, ",") {
		wl, err := workloadNamed(w, o, kit)
		if err != nil {
			return err
		}
		rows, err := wl.run(ctx, o, kit)
		if err != nil {
			return err
		}
		printTable(os.Stdout, wl, rows, o.base != nil)
		switch {
		case o.base != nil:
			// The checks compare against rows a comparison does not run.
		case wl.name == "early-stop":
			printChecks(os.Stdout, rows)
		case wl.limit > 0:
			printPrefixChecks(os.Stdout, wl, rows)
		}
		fmt.Println()
	}
	return nil
}

func warmupText(o options) string {
	if o.warmup > 0 {
		return fmt.Sprintf("%d uncounted", o.warmup)
	}
	return "one uncounted per client"
}
