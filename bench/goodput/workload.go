package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

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
	if err := benchkit.WritePromptLengths(prompts, o.Seed); err != nil {
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
			fmt.Fprintln(&ob, []int{128, 512}[(i*7+int(o.Seed))%2])
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
		Levels: levels, Requests: o.requests, Prompts: w.prompts, Outputs: w.outputs, Seed: o.Seed, Strict: w.strict})
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
		"--time-scale", strconv.FormatFloat(o.TimeScale, 'g', -1, 64), "--seed", strconv.FormatUint(o.Seed, 10), "--model", model}
	args = append(append(args, w.simArgs...), extra...)
	return kit.StartSim(ctx, benchkit.Slug(w.name+"-"+name)+"-sim", args...)
}
