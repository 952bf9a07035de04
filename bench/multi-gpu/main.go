// Command multi-gpu measures what kvgate gets out of several GPUs behind one
// model, and what it keeps when one of them dies, in one run. It starts
// simulated GPUs (kvgate sim --on-overflow oom: Llama-3-8B on 24 GiB, its
// pool at 0.9 and the gateway's ceiling at 0.9, so that each budget is its
// whole pool; outputs that stop early, lognormal median 200, σ 0.8, under
// max_tokens 1024) and a gateway in front of them, and sends the same
// workload to
//
//	(a) a gateway with one backend,
//	(b) a gateway with three,
//	(c) a gateway with three, one of them killed (SIGKILL) mid-run,
//
// each with --clients-per-backend clients per backend (a closed loop), so
// that every configuration is saturated: the program states how many
// requests a pool holds at their worst case and how many times that the
// clients are. It prints one table and the acceptance checks.
//
//	go run ./bench/multi-gpu [--requests 3000] [--clients-per-backend 128] [--time-scale 0.5]
//
// Goodput is output tokens per second of answered requests. kvgate
// loadtest gives it over its whole step (from the first request sent to the
// last answered, so the drain at the end weighs on short runs); the
// acceptance checks read it over the saturated window instead: the gateway's
// own count of answered output tokens (kvgate_tokens_actual_total), sampled
// every 250 ms, over the middle of the span during which every client had a
// request in flight (20 % to 80 % of it). In (c) the window after the kill
// runs from the moment of the SIGKILL to the same 80 % mark, so it includes
// the requests lost on the dead GPU and the time the gateway took to notice.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// The simulated GPU and the model it serves.
const (
	model       = benchkit.Model
	utilization = "0.9"
	maxTokens   = 1024
	blockTokens = 16
	interval    = 250 * time.Millisecond // sampling of the gateway and the simulators
)

type options struct {
	*benchkit.Flags
	requests, perBackend, backends int
	killAt                         float64
}

func main() {
	o := options{Flags: benchkit.Register(benchkit.Defaults{TimeScale: 0.5, Seed: 7, Draws: "the prompt and output lengths", Out: true})}
	flag.IntVar(&o.requests, "requests", 3000, "counted requests of each configuration (the same workload in each)")
	flag.IntVar(&o.perBackend, "clients-per-backend", 128, "concurrent clients per backend (at least 4× what a pool holds at worst case)")
	flag.IntVar(&o.backends, "backends", 3, "backends of the fleet")
	flag.Float64Var(&o.killAt, "kill-at", 0.3, "share of the run's requests answered when one simulator is killed in (c)")
	flag.Parse()
	if o.requests < 100 || o.perBackend < 1 || o.backends < 2 || o.TimeScale <= 0 || o.killAt <= 0 || o.killAt >= 0.8 {
		fmt.Fprintln(os.Stderr, "fleet: --requests must be >= 100, --clients-per-backend >= 1, --backends >= 2, --time-scale > 0, --kill-at in (0, 0.8)")
		os.Exit(2)
	}
	o.Main("fleet", func(ctx context.Context, kit *benchkit.Kit) error { return run(ctx, kit, o) })
}

// setup is one configuration of the run.
type setup struct {
	name     string
	backends int
	kill     bool // SIGKILL the last simulator mid-run
}

func run(ctx context.Context, kit *benchkit.Kit, o options) error {
	prompts := kit.Path("prompts.txt")
	if err := benchkit.WritePromptLengths(prompts, o.Seed); err != nil {
		return err
	}
	kit.Header(os.Stdout, "fleet", fmt.Sprintf("%d requests a configuration, %d clients a backend, simulator time scale %g", o.requests, o.perBackend, o.TimeScale), "reports and logs")
	setups := []setup{
		{name: "one backend", backends: 1},
		{name: fmt.Sprintf("%d backends", o.backends), backends: o.backends},
		{name: fmt.Sprintf("%d backends, one killed", o.backends), backends: o.backends, kill: true},
	}
	var rows []*result
	for _, s := range setups {
		r, err := measure(ctx, kit, o, s, prompts)
		if err != nil {
			return err
		}
		rows = append(rows, r)
	}
	printTable(os.Stdout, o, rows)
	fmt.Println()
	if !printChecks(os.Stdout, rows) {
		return errors.New("an acceptance check failed")
	}
	return nil
}

// measure runs one configuration: simulators, a gateway, the load, the
// samples.
func measure(ctx context.Context, kit *benchkit.Kit, o options, s setup, prompts string) (*result, error) {
	r := &result{setup: s, clients: o.perBackend * s.backends}
	slug := benchkit.Slug(s.name)
	sims := make([]*benchkit.Process, s.backends)
	for i := range sims {
		p, err := kit.StartSim(ctx, fmt.Sprintf("%s-sim%d", slug, i), "--on-overflow", "oom", "--gpu-memory-utilization", utilization,
			"--time-scale", strconv.FormatFloat(o.TimeScale, 'g', -1, 64), "--seed", strconv.FormatUint(o.Seed+uint64(i), 10),
			"--model", model, "--output-len", "lognormal:200,0.8")
		if err != nil {
			return nil, err
		}
		defer p.Stop()
		sims[i] = p
	}
	gw, err := startGateway(ctx, kit, slug, sims)
	if err != nil {
		return nil, err
	}
	defer gw.Stop()
	client := &http.Client{Timeout: 5 * time.Second}
	if r.poolFit, err = poolFit(ctx, client, sims[0].URL, prompts); err != nil {
		return nil, err
	}

	smp := &sampler{client: client, gateway: gw.URL, sims: sims, start: time.Now()}
	if s.kill {
		// Warm-up requests (one a client) are answered too.
		smp.killAfter = o.killAt * float64(o.requests+r.clients)
		smp.victim = len(sims) - 1
	}
	sctx, stopSampling := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); smp.run(sctx) }()
	steps, err := kit.Load(ctx, benchkit.Load{Name: s.name, Target: gw.URL, MetricsURL: "none", Model: model,
		Levels: strconv.Itoa(r.clients), Requests: o.requests, Prompts: prompts, Outputs: "fixed:" + strconv.Itoa(maxTokens),
		Seed: o.Seed, Strict: true})
	stopSampling()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	r.load = cmp.Or(benchkit.LoadAverage(), "?")
	if s.kill && smp.killed < 0 {
		return nil, fmt.Errorf("%s: the run ended before %.0f requests were answered: nothing was killed", s.name, smp.killAfter)
	}
	r.step = steps[0]
	end, err := benchkit.Scrape(ctx, client, gw.URL+"/metrics")
	if err != nil {
		return nil, fmt.Errorf("%s: gateway metrics at the end: %w", s.name, err)
	}
	if err := smp.writeCSV(kit.Path(slug + "-samples.csv")); err != nil {
		return nil, err
	}
	if err := r.read(smp, end); err != nil {
		return nil, fmt.Errorf("%s: %w", s.name, err)
	}
	if r.moved, err = countLines(gw.Log, "moved the request to another GPU"); err != nil {
		return nil, err
	}
	return r, nil
}

// startGateway writes the config of a gateway in front of sims and starts
// it. Health checks run every 250 ms and two failures open a circuit, as
// an operator who wants a dead GPU out of routing quickly would set them.
func startGateway(ctx context.Context, kit *benchkit.Kit, slug string, sims []*benchkit.Process) (*benchkit.Process, error) {
	var b strings.Builder
	for i, s := range sims {
		fmt.Fprintf(&b, "  - {name: sim%d, url: '%s', models: [%s], gpu_memory: 24GiB, health: {interval: 250ms, failures: 2}}\n", i, s.URL, model)
	}
	return kit.StartGatewayOver(ctx, slug, utilization, "", "", b.String())
}

var numBlocks = regexp.MustCompile(`num_gpu_blocks="(\d+)"`)

// poolFit is how many of the workload's requests one simulator's pool
// holds at their worst case (prompt + max_tokens), on average.
func poolFit(ctx context.Context, c *http.Client, simURL, prompts string) (float64, error) {
	m, err := benchkit.Scrape(ctx, c, simURL+"/metrics")
	if err != nil {
		return 0, err
	}
	var blocks float64
	for k := range m {
		if sm := numBlocks.FindStringSubmatch(k); sm != nil {
			blocks, _ = strconv.ParseFloat(sm[1], 64)
		}
	}
	if blocks == 0 {
		return 0, fmt.Errorf("%s/metrics: no num_gpu_blocks in vllm:cache_config_info", simURL)
	}
	data, err := os.ReadFile(prompts)
	if err != nil {
		return 0, err
	}
	var sum float64
	n := 0
	for _, f := range strings.Fields(string(data)) {
		p, err := strconv.Atoi(f)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", prompts, err)
		}
		sum += math.Ceil(float64(p+maxTokens) / blockTokens)
		n++
	}
	return blocks / (sum / float64(n)), nil
}
