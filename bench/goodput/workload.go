package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// workload is one traffic shape: prompt lengths and how outputs end, and
// for the prefix workloads what their requests share.
type workload struct {
	name, title string
	promptNote  string   // the prompts, as the table states them
	simArgs     []string // output lengths the simulator draws
	outputs     string   // the load tester's --output-tokens
	strict      bool     // --strict-openai: let the simulator stop outputs early
	prompts     string   // file of prompt lengths
	// shared is the system prompt every request opens with (tokens), turns
	// the requests of a session; both 0 for the workloads without prefixes,
	// which are measured against a sweep, the others against vLLM's prefix
	// cache and the gateway that does not count it.
	shared, turns int
	// limit is the fixed concurrency limit of the prefix workloads: what
	// fits the pool at worst case, the system prompt held once.
	limit int
}

// poolTokens is the simulated GPU's KV pool: 2888 blocks of 16 tokens.
const poolTokens = 2888 * 16

// The prefix workloads' outputs: as early-stop's, lognormal median 200,
// σ 0.8, drawn by the simulator, under max_tokens 1024.
const maxTokens = 1024

var earlyStop = []string{"--output-len", "lognormal:200,0.8"}

// writeUniform writes 4096 lengths drawn uniformly from [lo, hi] to path.
func writeUniform(path string, lo, hi int, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, 2))
	var b strings.Builder
	for range 4096 {
		fmt.Fprintln(&b, lo+r.IntN(hi-lo+1))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func workloadNamed(name string, o options, kit *benchkit.Kit) (*workload, error) {
	prompts := kit.Path("prompts.txt")
	if err := benchkit.WritePromptLengths(prompts, o.Seed); err != nil {
		return nil, err
	}
	const mixed = "prompts 90% ≈256, 10% ≈4000 tokens"
	switch name {
	case "early-stop":
		return &workload{name: name, title: "outputs that stop early (lognormal median 200, σ 0.8, max_tokens 1024)", promptNote: mixed,
			simArgs: earlyStop, outputs: "fixed:1024", strict: true, prompts: prompts}, nil
	case "shared-prefix":
		const shared, lo, hi = 2048, 80, 120
		unique := kit.Path("prompts-unique.txt")
		if err := writeUniform(unique, lo, hi, o.Seed); err != nil {
			return nil, err
		}
		return &workload{name: name, title: "one system prompt shared by every request, outputs that stop early (lognormal median 200, σ 0.8, max_tokens 1024)",
			promptNote: fmt.Sprintf("prompts: the same %d-token system prompt, then %d–%d tokens of their own", shared, lo, hi),
			simArgs:    earlyStop, outputs: fmt.Sprintf("fixed:%d", maxTokens), strict: true, prompts: unique,
			shared: shared, limit: (poolTokens - shared) / (hi + maxTokens)}, nil
	case "chat":
		const shared, lo, hi, turns = 1024, 50, 150, 4
		user := kit.Path("prompts-user.txt")
		if err := writeUniform(user, lo, hi, o.Seed); err != nil {
			return nil, err
		}
		// A session's last turn at worst: every user message at its
		// longest, every earlier answer and its own at max_tokens.
		worst := turns*hi + turns*maxTokens
		return &workload{name: name, title: fmt.Sprintf("chat sessions of %d turns re-sending their history, outputs that stop early (lognormal median 200, σ 0.8, max_tokens 1024)", turns),
			promptNote: fmt.Sprintf("prompts: the same %d-token system prompt, the session so far, a %d–%d-token user message", shared, lo, hi),
			simArgs:    earlyStop, outputs: fmt.Sprintf("fixed:%d", maxTokens), strict: true, prompts: user,
			shared: shared, turns: turns, limit: (poolTokens - shared) / worst}, nil
	case "fixed":
		outs := kit.Path("outputs-fixed.txt")
		var ob strings.Builder
		for i := range 4096 {
			fmt.Fprintln(&ob, []int{128, 512}[(i*7+int(o.Seed))%2])
		}
		if err := os.WriteFile(outs, []byte(ob.String()), 0o644); err != nil {
			return nil, err
		}
		return &workload{name: name, title: "outputs of fixed length (128 or 512 tokens, max_tokens = the length)", promptNote: mixed,
			outputs: "file:" + outs, prompts: prompts}, nil
	}
	return nil, fmt.Errorf("unknown workload %q (want early-stop, fixed, shared-prefix or chat)", name)
}

// row is one configuration's figures.
type row struct {
	name, note string
	benchkit.Step
}

func (w *workload) run(ctx context.Context, o options, kit *benchkit.Kit) ([]row, error) {
	if o.base != nil {
		return w.runPaired(ctx, o, kit)
	}
	if w.limit > 0 {
		return w.runPrefix(ctx, o, kit)
	}
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
		{"gateway predicted", "oom simulator", predictedKeys(o), "oom"},
		{"gateway predicted", "preempt simulator", predictedKeys(o), "preempt"},
	}
	for _, g := range gw {
		rs, err := w.gateway(ctx, o, kit, kit, g.name+" "+g.overflow, g.overflow, conc, g.extra)
		if err != nil {
			return nil, err
		}
		r := rs[0]
		r.name, r.note = g.name, g.note
		rows = append(rows, r)
	}
	pre, err := w.preempt(ctx, o, kit, conc, "no gateway")
	if err != nil {
		return nil, err
	}
	rows = append(rows, pre)
	unb, err := w.direct(ctx, o, kit, "direct-unbounded", "preempt", conc, []string{"--gpu-memory", "320GiB"})
	if err != nil {
		return nil, err
	}
	unb[0].name, unb[0].note = "unbounded pool", "compute ceiling"
	rows = append(rows, unb[0])
	return rows, nil
}

// runPaired measures the gateway rows with reservations twice each, with
// this build and with the baseline's (--baseline), in front of the same
// simulator configuration and load: a prefix workload with its prompt
// blocks shared, as the gateway counts them by default.
func (w *workload) runPaired(ctx context.Context, o options, kit *benchkit.Kit) ([]row, error) {
	var rows []row
	for _, g := range []struct{ name, admission string }{
		{"gateway worst_case", "  reservation: worst_case\n"},
		{"gateway predicted", predictedKeys(o)},
	} {
		for _, b := range []struct {
			serve *benchkit.Kit
			note  string
		}{{kit, "this build"}, {o.base, "baseline"}} {
			rs, err := w.gateway(ctx, o, kit, b.serve, g.name+" "+b.note, "oom", strconv.Itoa(o.clients), g.admission)
			if err != nil {
				return nil, err
			}
			r := rs[0]
			r.name, r.note = g.name, b.note
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// runPrefix measures a prefix workload: the gateway with a fixed limit, with
// each reservation policy counting shared prompt blocks once, with the
// predicted policy counting every prompt whole (what the
// gateway did before it knew of prefix caches), and vLLM alone with its
// prefix cache, driven directly. There is no sweep: the fixed limit is what
// the pool holds at worst case.
func (w *workload) runPrefix(ctx context.Context, o options, kit *benchkit.Kit) ([]row, error) {
	conc := strconv.Itoa(o.clients)
	gw := []struct {
		name, note, admission, backend string
	}{
		{"gateway count", fmt.Sprintf("max_concurrency %d", w.limit), fmt.Sprintf("  mode: count\n  max_concurrency: %d\n", w.limit), ""},
		{"gateway worst_case", "", "  reservation: worst_case\n", ""},
		{"gateway predicted", "", predictedKeys(o), ""},
		{"gateway predicted", "prefix_caching: off", predictedKeys(o), "    prefix_caching: off\n"},
	}
	var rows []row
	for _, g := range gw {
		name := g.name
		if g.backend != "" {
			name += " unshared"
		}
		sim, err := w.startSim(ctx, o, kit, name, "oom", nil)
		if err != nil {
			return nil, err
		}
		gwp, err := kit.StartGatewayOver(ctx, w.name+"-"+name, utilization, g.admission, "", fmt.Sprintf(`  - name: sim0
    url: %s
    models: [%s]
    gpu_memory: 24GiB
%s`, sim.URL, model, g.backend))
		if err != nil {
			sim.Stop()
			return nil, err
		}
		rs, err := w.load(ctx, o, kit, name, gwp.URL, sim.URL+"/metrics", conc)
		gwp.Stop()
		sim.Stop()
		if err != nil {
			return nil, err
		}
		r := rs[0]
		r.name, r.note = g.name, g.note
		rows = append(rows, r)
	}
	pre, err := w.preempt(ctx, o, kit, conc, "prefix cache, no gateway")
	if err != nil {
		return nil, err
	}
	return append(rows, pre), nil
}

// preempt is the row of vLLM's own preempt mode, driven directly.
func (w *workload) preempt(ctx context.Context, o options, kit *benchkit.Kit, conc, note string) (row, error) {
	pre, err := w.direct(ctx, o, kit, "direct-preempt", "preempt", conc, nil)
	if err != nil {
		return row{}, err
	}
	pre[0].name, pre[0].note = "direct, vLLM preempt", note
	return pre[0], nil
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

// predictedKeys is the admission section of the predicted rows.
func predictedKeys(o options) string {
	keys := "  reservation: predicted\n"
	for _, kv := range strings.Split(o.predicted, ",") {
		if kv = strings.TrimSpace(kv); kv != "" {
			keys += "  " + kv + "\n"
		}
	}
	return keys
}

// gateway runs the load through a gateway, started by serve (kit, or the
// baseline build's), in front of a simulator.
func (w *workload) gateway(ctx context.Context, o options, kit, serve *benchkit.Kit, name, overflow, levels, admission string) ([]row, error) {
	sim, err := w.startSim(ctx, o, kit, name, overflow, nil)
	if err != nil {
		return nil, err
	}
	defer sim.Stop()
	g, err := serve.StartGateway(ctx, name, sim.URL, utilization, admission, "")
	if err != nil {
		return nil, err
	}
	defer g.Stop()
	rows, err := w.load(ctx, o, kit, name, g.URL, sim.URL+"/metrics", levels)
	reportGuard(ctx, name, g.URL)
	return rows, err
}

// reportGuard says what the guard did in a gateway's run: streams stopped
// (and resumed) and forecasts distrusted, each of which held the model at
// its worst case for a cool-down.
func reportGuard(ctx context.Context, name, url string) {
	var st struct {
		Admission struct {
			GuardStops int64            `json:"guard_stops"`
			Trips      map[string]int64 `json:"forecast_trips"`
		} `json:"admission"`
	}
	if err := benchkit.Status(ctx, http.DefaultClient, url, &st); err == nil && (st.Admission.GuardStops > 0 || len(st.Admission.Trips) > 0) {
		fmt.Fprintf(os.Stderr, "%s: guard stops %d, forecast trips %v\n", name, st.Admission.GuardStops, st.Admission.Trips)
	}
}

// load runs kvgate loadtest against url at levels.
func (w *workload) load(ctx context.Context, o options, kit *benchkit.Kit, name, url, metrics, levels string) ([]row, error) {
	steps, err := kit.Load(ctx, benchkit.Load{Name: w.name + "-" + name, Target: url, MetricsURL: metrics, Model: model,
		Levels: levels, Requests: o.requests, Warmup: o.warmup, Prompts: w.prompts, Outputs: w.outputs, Seed: o.Seed, Strict: w.strict,
		SharedPrefix: w.shared, Turns: w.turns})
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
