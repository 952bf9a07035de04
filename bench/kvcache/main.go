// Command kvcache measures binding by cache: four simulated GPUs behind
// one model, many chat sessions whose turns re-send a long history (more
// of them than one GPU caches), at saturation. Each configuration runs the
// same load through a gateway over four fresh simulators:
//
//   - cache: backends[].kv_events, each simulator publishing vLLM's KV
//     events: a request goes where its prefill plus the GPU's load is least;
//   - held prefix: today's binding without events, where a request adds
//     least to what running requests hold, then the most room;
//   - least loaded: backends[].prefix_caching: off, so the most room alone.
//
// It prints goodput (output tokens/s of answered requests), p90 time to
// first token, the simulators' prefix-cache hit rate, overflows and
// failures, then its checks against the bars binding by cache must meet.
//
//	go run ./bench/kvcache [--requests 400] [--clients 24] [--time-scale 0.5]
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

const gpus = 4

type options struct {
	*benchkit.Flags
	requests, clients, turns, lo, hi int
}

func main() {
	o := options{Flags: benchkit.Register(benchkit.Defaults{TimeScale: 0.5, Seed: 7, Draws: "the user messages' lengths", Out: true})}
	flag.IntVar(&o.requests, "requests", 400, "requests a run")
	flag.IntVar(&o.clients, "clients", 24, "concurrent sessions: more than one GPU caches, fewer than all four do")
	flag.IntVar(&o.turns, "turns", 4, "turns a session, each re-sending the history")
	flag.IntVar(&o.lo, "message-min", 1000, "shortest user message (a document), tokens")
	flag.IntVar(&o.hi, "message-max", 1600, "longest user message, tokens")
	flag.Parse()
	o.Main("kvcache", func(ctx context.Context, kit *benchkit.Kit) error { return run(ctx, kit, o) })
}

type config struct {
	name, backend string
	events        bool
}

type result struct {
	config
	benchkit.Step
	hitRate float64
}

func run(ctx context.Context, kit *benchkit.Kit, o options) error {
	kit.Header(os.Stdout, "kvcache", fmt.Sprintf("%d GPUs, %d sessions of %d turns, user messages %d–%d tokens, outputs 64, %d requests, simulator time scale %g",
		gpus, o.clients, o.turns, o.lo, o.hi, o.requests, o.TimeScale), "reports and logs")
	prompts := kit.Path("messages.txt")
	var b []byte
	for i := range 4096 {
		b = strconv.AppendInt(b, int64(o.lo+int((uint64(i)*0x9e3779b97f4a7c15^o.Seed)%uint64(o.hi-o.lo+1))), 10)
		b = append(b, '\n')
	}
	if err := os.WriteFile(prompts, b, 0o644); err != nil {
		return err
	}
	var rs []result
	for _, c := range []config{{name: "cache", events: true}, {name: "held prefix"}, {name: "least loaded", backend: "    prefix_caching: off\n"}} {
		r, err := runOne(ctx, kit, o, c, prompts)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		rs = append(rs, r)
	}
	fmt.Printf("\n%-14s %10s %12s %9s %9s %6s %6s\n", "binding", "goodput", "p90 TTFT ms", "cache hit", "overflow", "ok", "failed")
	for _, r := range rs {
		fmt.Printf("%-14s %10.1f %12.0f %8.1f%% %9.0f %6d %6d\n", r.name, r.Goodput, r.TTFTP90, 100*r.hitRate, r.Overflow, r.OK, r.Failed)
	}
	cache, held, least := rs[0], rs[1], rs[2]
	fmt.Println()
	benchkit.Check(os.Stdout, cache.Goodput >= 1.5*least.Goodput, "cache %.2f× least loaded's goodput (≥ 1.5×)", cache.Goodput/least.Goodput)
	benchkit.Check(os.Stdout, cache.TTFTP90 <= 0.5*least.TTFTP90, "cache %.2f× least loaded's p90 TTFT (≤ 0.5×)", cache.TTFTP90/least.TTFTP90)
	benchkit.Check(os.Stdout, cache.Goodput >= held.Goodput, "cache %.2f× held prefix's goodput (≥ 1×)", cache.Goodput/held.Goodput)
	benchkit.Check(os.Stdout, cache.Overflow == 0 && cache.Overflowed == 0, "cache: %.0f overflows", cache.Overflow)
	return nil
}

func runOne(ctx context.Context, kit *benchkit.Kit, o options, c config, prompts string) (result, error) {
	var backends string
	var sims []*benchkit.Process
	defer func() {
		for _, s := range sims {
			s.Stop()
		}
	}()
	for i := range gpus {
		args := []string{"--on-overflow", "oom", "--gpu-memory-utilization", "0.9", "--time-scale", strconv.FormatFloat(o.TimeScale, 'g', -1, 64),
			"--seed", strconv.FormatUint(o.Seed, 10), "--model", benchkit.Model}
		var kv string
		if c.events {
			ports, err := benchkit.FreePorts(2)
			if err != nil {
				return result{}, err
			}
			args = append(args, "--kv-events-config", fmt.Sprintf(`{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:%d", "replay_endpoint": "tcp://127.0.0.1:%d", "topic": "kv"}`, ports[0], ports[1]))
			kv = fmt.Sprintf("    kv_events: {endpoint: \"tcp://127.0.0.1:%d\", replay_endpoint: \"tcp://127.0.0.1:%d\", topic: kv}\n", ports[0], ports[1])
		}
		s, err := kit.StartSim(ctx, benchkit.Slug(c.name)+"-sim"+strconv.Itoa(i), args...)
		if err != nil {
			return result{}, err
		}
		sims = append(sims, s)
		backends += fmt.Sprintf("  - name: sim%d\n    url: %s\n    models: [%s]\n    gpu_memory: 24GiB\n%s%s", i, s.URL, benchkit.Model, c.backend, kv)
	}
	gw, err := kit.StartGatewayOver(ctx, c.name, "0.9", "", "", backends)
	if err != nil {
		return result{}, err
	}
	defer gw.Stop()
	steps, err := kit.Load(ctx, benchkit.Load{Name: c.name, Target: gw.URL, MetricsURL: "none", Model: benchkit.Model,
		Levels: strconv.Itoa(o.clients), Requests: o.requests, Prompts: prompts, Outputs: "fixed:64", Seed: o.Seed, Turns: o.turns})
	if err != nil {
		return result{}, err
	}
	r := result{config: c, Step: steps[0]}
	var q, h, oom float64
	for _, s := range sims {
		m, err := benchkit.Scrape(ctx, http.DefaultClient, s.URL+"/metrics")
		if err != nil {
			return result{}, err
		}
		q += m.Sum("vllm:prefix_cache_queries_total")
		h += m.Sum("vllm:prefix_cache_hits_total")
		oom += m.Sum("kvsim_oom_events_total")
	}
	if q > 0 {
		r.hitRate = h / q
	}
	r.Overflow = oom
	return r, nil
}
