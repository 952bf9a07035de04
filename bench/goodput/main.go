// Command goodput measures what kvgate's admission policies get out of one
// simulated GPU, side by side with what users would otherwise run, in one
// run: the simulator straight at a sweep of concurrency limits (the best one
// that never overflowed is what a fixed limit gives), the gateway with that
// limit (admission.mode count), with worst-case reservations, and with
// predicted ones (the default), vLLM's own preempt mode driven directly, and
// the same simulator with a pool too large to fill (what no scheduler can
// beat). It prints one table per workload: goodput (output tokens per second
// of answered requests), real KV use over the saturated part of the run and
// at its peak, overflow events, preemptions, sheds and failures; then the
// issue's acceptance checks against it.
//
//	go run ./bench/goodput [--requests 1500] [--clients 128] [--time-scale 0.5] [--sweep 8..32+4]
//
// The time scale is set so that the engine model, not the machine, is the
// limit: the simulator, the gateway and the load generator share the
// machine's cores, and at 0.25 on two of them the fastest configurations
// (the unbounded pool, the predicted policy) were capped by CPU below what
// the engine allows, pressing every ratio toward 1.
//
// It builds kvgate, starts every simulator and gateway as a process of its
// own on free loopback ports, and drives them with kvgate loadtest.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

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
	requests  int
	clients   int
	timeScale float64
	sweep     string
	out       string
	kvgate    string
	workloads string
	seed      uint64
}

func main() {
	var o options
	flag.IntVar(&o.requests, "requests", 1500, "requests per measured step")
	flag.IntVar(&o.clients, "clients", 128, "concurrent clients of the saturated steps (at least 4× what the pool holds at worst case)")
	flag.Float64Var(&o.timeScale, "time-scale", 0.5, "simulator wall time per simulated time (0.5: twice as fast as a real GPU)")
	flag.StringVar(&o.sweep, "sweep", "8..32+4", "concurrency limits tried straight at the simulator")
	flag.StringVar(&o.out, "out", "", "directory for the load tester's JSON reports and the logs (default: a temporary one)")
	flag.StringVar(&o.kvgate, "kvgate", "", "kvgate binary (default: go build ./cmd/kvgate)")
	flag.StringVar(&o.workloads, "workloads", "early-stop,fixed", "workloads to run: early-stop (lognormal outputs stopping early), fixed (outputs of 128 or 512)")
	flag.Uint64Var(&o.seed, "seed", 7, "seed of the prompt and output lengths")
	flag.Parse()
	benchkit.Main("goodput", func(ctx context.Context) error { return run(ctx, o) })
}

func run(ctx context.Context, o options) error {
	kit, err := benchkit.New(ctx, "kvgate-goodput-", o.out, o.kvgate)
	if err != nil {
		return err
	}
	fmt.Printf("kvgate goodput benchmark: %s, %d CPUs, %s; %d requests a step, %d clients, simulator time scale %g\n",
		runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02 15:04 MST"), o.requests, o.clients, o.timeScale)
	fmt.Printf("reports and logs: %s\n\n", kit.Dir)
	for _, w := range strings.Split(o.workloads, ",") {
		wl, err := workloadNamed(w, o, kit)
		if err != nil {
			return err
		}
		rows, err := wl.run(ctx, o, kit)
		if err != nil {
			return err
		}
		printTable(os.Stdout, wl, rows)
		if wl.name == "early-stop" {
			printChecks(os.Stdout, rows)
		}
		fmt.Println()
	}
	return nil
}

// workload is one traffic shape: prompt lengths (90 % about 256 tokens,
// 10 % about 4000) and how outputs end.
type workload struct {
	name, title string
	simArgs     []string // output lengths the simulator draws
	outputs     string   // the load tester's --output-tokens
	strict      bool     // --strict-openai: let the simulator stop outputs early
	prompts     string   // file of prompt lengths
}

func workloadNamed(name string, o options, kit *benchkit.Kit) (*workload, error) {
	prompts := kit.Path("prompts.txt")
	if err := benchkit.WritePromptLengths(prompts, o.seed); err != nil {
		return nil, err
	}
	switch name {
	case "early-stop":
		return &workload{name: name, title: "outputs that stop early (lognormal median 200, σ 0.8, max_tokens 1024)",
			simArgs: []string{"--output-len", "lognormal:200,0.8"}, outputs: "fixed:1024", strict: true, prompts: prompts}, nil
	case "fixed":
		outs := kit.Path("outputs-fixed.txt")
		var ob strings.Builder
		for i := range 4096 {
			fmt.Fprintln(&ob, []int{128, 512}[(i*7+int(o.seed))%2])
		}
		if err := os.WriteFile(outs, []byte(ob.String()), 0o644); err != nil {
			return nil, err
		}
		return &workload{name: name, title: "outputs of fixed length (128 or 512 tokens, max_tokens = the length)",
			outputs: "file:" + outs, prompts: prompts}, nil
	}
	return nil, fmt.Errorf("unknown workload %q (want early-stop or fixed)", name)
}

// row is one configuration's figures.
type row struct {
	name, note string
	benchkit.Step
}

func (w *workload) run(ctx context.Context, o options, kit *benchkit.Kit) ([]row, error) {
	var rows []row
	// (a) Straight at an oom simulator, a sweep of concurrency limits: the
	// best level that never overflowed is what a fixed limit gives.
	sweep, err := w.direct(ctx, o, kit, "direct-sweep", "oom", o.sweep, nil)
	if err != nil {
		return nil, err
	}
	// The best safe limit is the highest level below the first that
	// overflowed: a higher one that got through its run was lucky.
	best := row{}
	for _, r := range sweep {
		if r.Overflow > 0 || r.Failed > 0 {
			break
		}
		best = r
	}
	if best.Level == 0 {
		return nil, fmt.Errorf("%s: every level of the sweep %s overflowed; try lower levels", w.name, o.sweep)
	}
	best.name, best.note = "direct, best safe limit", fmt.Sprintf("limit %d (of %s)", best.Level, o.sweep)
	rows = append(rows, best)
	for _, r := range sweep {
		if r.Level > best.Level {
			r.name, r.note = "direct, next limit", "overflowed"
			rows = append(rows, r)
			break
		}
	}
	conc := strconv.Itoa(o.clients)
	gw := []struct {
		name, note, extra, overflow string
	}{
		{"gateway count", fmt.Sprintf("max_concurrency %d", best.Level), fmt.Sprintf("  mode: count\n  max_concurrency: %d\n", best.Level), "oom"},
		{"gateway worst_case", "", "  reservation: worst_case\n", "oom"},
		{"gateway predicted", "oom simulator", "  reservation: predicted\n", "oom"},
		{"gateway predicted", "preempt simulator", "  reservation: predicted\n", "preempt"},
	}
	for _, g := range gw {
		rs, err := w.gateway(ctx, o, kit, g.name+" "+g.overflow, g.overflow, conc, g.extra)
		if err != nil {
			return nil, err
		}
		r := rs[0]
		r.name, r.note = g.name, g.note
		rows = append(rows, r)
	}
	pre, err := w.direct(ctx, o, kit, "direct-preempt", "preempt", conc, nil)
	if err != nil {
		return nil, err
	}
	pre[0].name, pre[0].note = "direct, vLLM preempt", "no gateway"
	rows = append(rows, pre[0])
	unb, err := w.direct(ctx, o, kit, "direct-unbounded", "preempt", conc, []string{"--gpu-memory", "320GiB"})
	if err != nil {
		return nil, err
	}
	unb[0].name, unb[0].note = "unbounded pool", "compute ceiling"
	rows = append(rows, unb[0])
	return rows, nil
}

// direct runs the load straight at a simulator.
func (w *workload) direct(ctx context.Context, o options, kit *benchkit.Kit, name, overflow, levels string, extra []string) ([]row, error) {
	sim, err := w.startSim(ctx, o, kit, name, overflow, extra)
	if err != nil {
		return nil, err
	}
	defer sim.Stop()
	return w.load(ctx, o, kit, name, sim.URL, sim.URL+"/metrics", levels)
}

// gateway runs the load through a gateway in front of a simulator.
func (w *workload) gateway(ctx context.Context, o options, kit *benchkit.Kit, name, overflow, levels, admission string) ([]row, error) {
	sim, err := w.startSim(ctx, o, kit, name, overflow, nil)
	if err != nil {
		return nil, err
	}
	defer sim.Stop()
	g, err := kit.StartGateway(ctx, name, sim.URL, utilization, admission, "")
	if err != nil {
		return nil, err
	}
	defer g.Stop()
	return w.load(ctx, o, kit, name, g.URL, sim.URL+"/metrics", levels)
}

// load runs kvgate loadtest against url at levels.
func (w *workload) load(ctx context.Context, o options, kit *benchkit.Kit, name, url, metrics, levels string) ([]row, error) {
	steps, err := kit.Load(ctx, benchkit.Load{Name: w.name + "-" + name, Target: url, MetricsURL: metrics, Model: model,
		Levels: levels, Requests: o.requests, Prompts: w.prompts, Outputs: w.outputs, Seed: o.seed, Strict: w.strict})
	if err != nil {
		return nil, err
	}
	rows := make([]row, len(steps))
	for i, s := range steps {
		rows[i].Step = s
	}
	return rows, nil
}

func (w *workload) startSim(ctx context.Context, o options, kit *benchkit.Kit, name, overflow string, extra []string) (*benchkit.Process, error) {
	args := []string{"--on-overflow", overflow, "--gpu-memory-utilization", utilization,
		"--time-scale", strconv.FormatFloat(o.timeScale, 'g', -1, 64), "--seed", strconv.FormatUint(o.seed, 10), "--model", model}
	args = append(append(args, w.simArgs...), extra...)
	return kit.StartSim(ctx, benchkit.Slug(w.name+"-"+name)+"-sim", args...)
}

func printTable(w io.Writer, wl *workload, rows []row) {
	fmt.Fprintf(w, "Workload %s: %s; prompts 90%% ≈256, 10%% ≈4000 tokens\n", wl.name, wl.title)
	fmt.Fprintf(w, "%-26s %-20s %6s %10s %7s %8s %7s %8s %8s %6s %6s %6s\n",
		"configuration", "", "conc", "goodput", "×best", "KV mean", "KV peak", "overflow", "preempt", "ok", "429", "failed")
	base := rows[0].Goodput
	for _, r := range rows {
		fmt.Fprintf(w, "%-26s %-20s %6d %10.0f %6.2f× %7.1f%% %6.1f%% %8.0f %8.0f %6d %6d %6d\n",
			r.name, r.note, r.Level, r.Goodput, r.Goodput/base, 100*r.KVMean, 100*r.KVPeak, r.Overflow, r.Preemptions, r.OK, r.Shed, r.Failed)
	}
	fmt.Fprintln(w, "goodput: output tokens/s of answered requests; KV mean: the simulator's KV use (share of its pool, = the gateway's budget) from 20% to 80% of the step's time; overflow: the simulator's out-of-memory events")
}

// printChecks states the acceptance bars against the early-stop
// table.
func printChecks(w io.Writer, rows []row) {
	find := func(name, note string) *row {
		for i := range rows {
			if rows[i].name == name && (note == "" || rows[i].note == note) {
				return &rows[i]
			}
		}
		return nil
	}
	best, worst := find("direct, best safe limit", ""), find("gateway worst_case", "")
	pred, predPre := find("gateway predicted", "oom simulator"), find("gateway predicted", "preempt simulator")
	pre, unb := find("direct, vLLM preempt", ""), find("unbounded pool", "")
	if best == nil || worst == nil || pred == nil || predPre == nil || pre == nil || unb == nil {
		return
	}
	check := func(ok bool, format string, a ...any) { benchkit.Check(w, ok, format, a...) }
	fmt.Fprintln(w, "Acceptance (issue \"Fill the pool\"), default config, early-stopping workload:")
	check(pred.KVMean >= 0.85, "real KV use %.1f%% of the budget over the saturated part (≥ 85%%)", 100*pred.KVMean)
	check(pred.Overflow == 0 && predPre.Overflow == 0, "zero overflow on the oom simulator (%.0f)", pred.Overflow)
	check(predPre.PreemptedPct <= 1, "preemptions on the preempt simulator %.0f, %.2f%% of requests (≤ 1%%)", predPre.Preemptions, predPre.PreemptedPct)
	check(pred.Failed == 0 && pred.Shed == 0, "every answer a 200 (%d sheds, %d failures)", pred.Shed, pred.Failed)
	check(pred.Goodput >= 1.3*worst.Goodput, "predicted %.2f× worst_case (≥ 1.3×)", pred.Goodput/worst.Goodput)
	check(pred.Goodput >= 1.6*best.Goodput, "gateway %.2f× the best safe limit straight at the simulator (≥ 1.6×)", pred.Goodput/best.Goodput)
	check(pred.Goodput >= 0.95*pre.Goodput, "gateway %.0f%% of vLLM's preempt mode driven directly (≥ 95%%)", 100*pred.Goodput/pre.Goodput)
	check(pred.Goodput >= 0.8*unb.Goodput, "gateway %.0f%% of the unbounded pool (≥ 80%%)", 100*pred.Goodput/unb.Goodput)
}
