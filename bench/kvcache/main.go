// Command kvcache measures binding by cache: four simulated H100s behind
// one model, on two workloads.
//
// Sessions, where binding by cache matters: many RAG or agent sessions,
// each opening with a long context (a system prompt every session shares,
// then the documents the session is about, thousands of tokens) and going
// on with short questions and short answers, every turn re-sending the
// whole history after a pause (the user reading and typing, the agent's
// tool running), during which the other sessions' requests reach the
// GPUs; more sessions than one GPU caches, fewer than the four do; enough
// of them that least-loaded binding runs its GPUs at saturation.
//
// The simulators are H100-class: 80 GiB (459,000 tokens of Llama 3 8B's
// KV each at --gpu-memory-utilization 0.9), prefill 20,000 tokens/s
// (50 µs a token, about a third of the H100's dense bf16 peak at 16
// GFLOP a token; the cached blocks of a prompt are not computed again), a
// decode step 15 ms plus 0.15 ms a running sequence. A turn whose history
// is cached where it goes prefills its question alone; one that is not
// prefills its whole history again, stalling every decode on that GPU.
//
// Unique prompts, where it must cost nothing: every prompt distinct (no
// shared prefix, no turns, no pause), the lengths of the sessions'
// contexts.
//
// Each configuration runs the same load through a gateway over four fresh
// simulators:
//
//   - cache: backends[].kv_events, each simulator publishing vLLM's KV
//     events: a request goes where it must prefill least, then the least
//     loaded (admission/cacheview.go);
//   - held prefix: binding without events, where a request adds least to
//     what running requests hold, then the most room;
//   - least loaded: backends[].prefix_caching: off, so the most room alone.
//
// It prints goodput (output tokens/s of answered requests), p90 time to
// first token, the simulators' prefix-cache hit rate, overflows and
// failures, then its checks against the bars binding by cache must meet.
//
//	go run ./bench/kvcache [--workloads sessions,unique] [--requests 960] [--clients 160] [--think 4s]
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

const (
	gpus      = 4
	gpuMemory = "80GiB"
	prefill   = "50us" // a prompt token's prefill
)

type options struct {
	*benchkit.Flags
	workloads                        string
	requests, clients, turns, system int
	context, message, outputs        string
	think                            time.Duration
}

func main() {
	o := options{Flags: benchkit.Register(benchkit.Defaults{TimeScale: 1, Seed: 7, Draws: "the lengths, the words and the pauses", Out: true})}
	flag.StringVar(&o.workloads, "workloads", "sessions,unique", "which workloads to run, comma-separated: sessions, unique")
	flag.IntVar(&o.requests, "requests", 960, "counted requests a run")
	flag.IntVar(&o.clients, "clients", 160, "sessions at once (closed loop, each starting a new one when it ends): more than one GPU caches, fewer than all four do")
	flag.IntVar(&o.turns, "turns", 8, "turns a session, each re-sending the history")
	flag.DurationVar(&o.think, "think", 4*time.Second, "a session's mean pause before its next turn, in simulated time")
	flag.IntVar(&o.system, "system", 1000, "system prompt every session shares, tokens")
	flag.StringVar(&o.context, "context", "uniform:4000-6000", "a session's documents, its first message (and a unique prompt's length), tokens")
	flag.StringVar(&o.message, "message", "uniform:50-200", "a later turn's question, tokens")
	flag.StringVar(&o.outputs, "outputs", "uniform:64-256", "answer length, tokens")
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

var (
	cache  = config{name: "cache", events: true}
	held   = config{name: "held prefix"}
	least  = config{name: "least loaded", backend: "    prefix_caching: off\n"}
	shapes = map[string][]config{"sessions": {cache, held, least}, "unique": {cache, least}}
)

func run(ctx context.Context, kit *benchkit.Kit, o options) error {
	kit.Header(os.Stdout, "kvcache", fmt.Sprintf("%d simulated GPUs of %s (prefill %s a token), %d clients, outputs %s, %d requests a run, simulator time scale %g",
		gpus, gpuMemory, prefill, o.clients, o.outputs, o.requests, o.TimeScale), "reports and logs")
	for _, wl := range strings.Split(o.workloads, ",") {
		cs, ok := shapes[wl]
		if !ok {
			return fmt.Errorf("--workloads: %q is not sessions or unique", wl)
		}
		load := benchkit.Load{Model: benchkit.Model, Levels: strconv.Itoa(o.clients), Requests: o.requests,
			PromptTokens: o.context, Outputs: o.outputs, Seed: o.Seed, MetricsURL: "none"}
		about := fmt.Sprintf("unique prompts of %s tokens", o.context)
		if wl == "sessions" {
			load.PromptTokens, load.SessionContext, load.SharedPrefix, load.Turns = o.message, o.context, o.system, o.turns
			load.Think = time.Duration(float64(o.think) * o.TimeScale)
			about = fmt.Sprintf("sessions of %d turns: a %d-token system prompt all share, documents of %s, questions of %s, pauses of %s",
				o.turns, o.system, o.context, o.message, o.think)
		}
		fmt.Printf("%s: %s\n", wl, about)
		var rs []result
		for _, c := range cs {
			r, err := runOne(ctx, kit, o, c, wl, load)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", wl, c.name, err)
			}
			rs = append(rs, r)
		}
		fmt.Printf("\n%-14s %10s %12s %9s %9s %6s %6s\n", "binding", "goodput", "p90 TTFT ms", "cache hit", "overflow", "ok", "failed")
		for _, r := range rs {
			fmt.Printf("%-14s %10.1f %12.0f %8.1f%% %9.0f %6d %6d\n", r.name, r.Goodput, r.TTFTP90, 100*r.hitRate, r.Overflow, r.OK, r.Failed)
		}
		fmt.Println()
		c, l := rs[0], rs[len(rs)-1]
		if wl == "sessions" {
			h := rs[1]
			benchkit.Check(os.Stdout, c.Goodput >= 1.5*l.Goodput, "cache %.2f× least loaded's goodput (≥ 1.5×)", c.Goodput/l.Goodput)
			benchkit.Check(os.Stdout, c.TTFTP90 <= 0.5*l.TTFTP90, "cache %.2f× least loaded's p90 TTFT (≤ 0.5×)", c.TTFTP90/l.TTFTP90)
			benchkit.Check(os.Stdout, c.Goodput >= h.Goodput, "cache %.2f× held prefix's goodput (≥ 1×)", c.Goodput/h.Goodput)
		} else {
			// No regression, within a run's noise.
			benchkit.Check(os.Stdout, c.Goodput >= 0.95*l.Goodput, "unique: cache %.2f× least loaded's goodput (≥ 0.95×)", c.Goodput/l.Goodput)
			benchkit.Check(os.Stdout, c.TTFTP90 <= 1.1*l.TTFTP90, "unique: cache %.2f× least loaded's p90 TTFT (≤ 1.1×)", c.TTFTP90/l.TTFTP90)
		}
		benchkit.Check(os.Stdout, c.Overflow == 0 && c.Overflowed == 0, "cache: %.0f overflows", c.Overflow)
		fmt.Println()
	}
	return nil
}

func runOne(ctx context.Context, kit *benchkit.Kit, o options, c config, wl string, load benchkit.Load) (result, error) {
	var backends string
	var sims []*benchkit.Process
	defer func() {
		for _, s := range sims {
			s.Stop()
		}
	}()
	for i := range gpus {
		args := []string{"--on-overflow", "oom", "--gpu-memory", gpuMemory, "--prefill-per-token", prefill, "--gpu-memory-utilization", "0.9", "--time-scale", strconv.FormatFloat(o.TimeScale, 'g', -1, 64),
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
		s, err := kit.StartSim(ctx, benchkit.Slug(wl+"-"+c.name)+"-sim"+strconv.Itoa(i), args...)
		if err != nil {
			return result{}, err
		}
		sims = append(sims, s)
		backends += fmt.Sprintf("  - name: sim%d\n    url: %s\n    models: [%s]\n    gpu_memory: %s\n%s%s", i, s.URL, benchkit.Model, gpuMemory, c.backend, kv)
	}
	gw, err := kit.StartGatewayOver(ctx, wl+"-"+c.name, "0.9", "", "", backends)
	if err != nil {
		return result{}, err
	}
	defer gw.Stop()
	load.Name, load.Target = wl+"-"+c.name, gw.URL
	steps, err := kit.Load(ctx, load)
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
