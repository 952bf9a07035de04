// Command shared-budget is the shared budget's end-to-end benchmark: a real
// redis-server, one `kvgate sim --on-overflow oom` (a simulated GPU that
// fails everything in flight when over-admitted), three `kvgate serve`
// replicas sharing its budget through Redis, and a fourth gateway with the
// in-process budget for comparison, all as separate processes on loopback.
// A closed-loop load of about ten times what the budget holds runs through
// them in phases:
//
//  1. saturation through the in-process gateway alone, then through the
//     three replicas: the real KV use the fleet reaches against one
//     gateway on the same load;
//  2. a second tenant, capped at a share of the budget (-tenant-share) and
//     of a higher class, sends its own load through all three replicas
//     beside the saturating one (tenant bulk, uncapped): what it holds on
//     the three together, read from their /status, never passes share ×
//     budget and comes close to it (tenants.go);
//  3. four requests of 40% of the budget each at r1 while the load keeps
//     all three busy: every one served, r1's small requests within 2x the
//     others' p99;
//  4. silent replicas under load: r1 paused (SIGSTOP) 10 s past its lease's
//     TTL and r2 cut off from Redis as long (no overflow), then r3 killed
//     with SIGKILL (the others bring real KV use back to 70% within 5 s);
//  5. redis-server stopped: the replicas serve on static shares; started
//     again: their leases resume;
//  6. light load, alternating between a shared replica and the in-process
//     gateway: the p50 latency the shared budget adds (last, so that its
//     short answers, all cut by max_tokens, are a small part of what the
//     predictors learned).
//
// The simulator's out-of-memory counter is read around every phase. It
// prints one table and a verdict per acceptance bar, and exits 1 if a bar
// is missed or a component is missing. bench/shared-budget/run.sh builds
// kvgate and runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

type options struct {
	kvgate, redisServer string
	clients             int
	timeScale           float64
	warmup, measure     time.Duration
	latencyRequests     int
	promptTokens        int
	maxTokens           int
	outputLen           string
	reservation         string
	keep, trace         bool
	tenants             tenantOptions
}

func main() {
	var o options
	flag.StringVar(&o.kvgate, "kvgate", "", "the kvgate binary (required; run.sh builds it)")
	flag.StringVar(&o.redisServer, "redis-server", "redis-server", "the redis-server binary")
	flag.IntVar(&o.clients, "clients", 160, "closed-loop clients at saturation: about ten times what the budget holds")
	flag.Float64Var(&o.timeScale, "time-scale", 0.1, "the simulator's wall time per simulated time (0.1: ten times faster than a real GPU)")
	flag.DurationVar(&o.warmup, "warmup", 20*time.Second, "load before each saturation measurement (the predictor warms up)")
	flag.DurationVar(&o.measure, "measure", 30*time.Second, "measured saturation window")
	flag.IntVar(&o.latencyRequests, "latency-requests", 2000, "light-load requests per target for the added latency")
	flag.IntVar(&o.promptTokens, "prompt-tokens", 512, "prompt tokens of each saturating request")
	flag.IntVar(&o.maxTokens, "max-tokens", 1024, "max_tokens of each saturating request")
	flag.StringVar(&o.outputLen, "output-len", "lognormal:200,0.8", "the simulator's output lengths (capped by max_tokens)")
	// worst_case by default: what it measures is the budget's sharing, and
	// under predicted a gateway's own forecast margin (its ε) moves the
	// numbers; -reservation predicted runs the same phases with it.
	flag.StringVar(&o.reservation, "reservation", "worst_case", "admission.reservation of every gateway: worst_case or predicted")
	flag.BoolVar(&o.keep, "keep", false, "keep the working directory (configs and logs)")
	flag.Float64Var(&o.tenants.share, "tenant-share", 0.25, "the capped tenant's share of the budget")
	flag.IntVar(&o.tenants.clients, "tenant-clients", 48, "the capped tenant's closed-loop clients, spread over the three replicas")
	flag.IntVar(&o.tenants.promptTokens, "tenant-prompt-tokens", 256, "prompt tokens of each of the capped tenant's requests")
	flag.IntVar(&o.tenants.maxTokens, "tenant-max-tokens", 256, "max_tokens of each of the capped tenant's requests (small, so that its share holds several)")
	flag.DurationVar(&o.tenants.warmup, "tenant-warmup", 10*time.Second, "the capped tenant's load before its holds are sampled")
	flag.DurationVar(&o.tenants.measure, "tenant-measure", 20*time.Second, "how long the capped tenant's holds are sampled")
	flag.BoolVar(&o.tenants.only, "tenants-only", false, "run the tenants phase alone (after the fleet's warm-up), not the others")
	flag.BoolVar(&o.trace, "trace", false, "print each replica's lease and commitments every 2 s while the fleet saturates")
	flag.Parse()
	benchkit.Main("shared-budget", func(ctx context.Context) error { return run(ctx, o) })
}

func run(ctx context.Context, o options) error {
	if o.kvgate == "" {
		return errors.New("-kvgate is required (bench/shared-budget/run.sh builds it)")
	}
	for _, bin := range []*string{&o.kvgate, &o.redisServer} {
		p, err := exec.LookPath(*bin)
		if err != nil {
			return fmt.Errorf("%s is required and was not found (apt-get install redis-server): %w", *bin, err)
		}
		*bin = p
	}
	kit, err := benchkit.New(ctx, "shared-budget-", "", o.kvgate)
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("working directory:", kit.Dir)
	} else {
		defer os.RemoveAll(kit.Dir)
	}
	b := &bench{o: o, kit: kit}
	defer kit.StopAll()
	if err := b.start(ctx); err != nil {
		return err
	}
	return b.phases(ctx)
}

type bench struct {
	o   options
	kit *benchkit.Kit

	redis        *benchkit.Process
	cut          *cutProxy // between r2 and Redis
	simURL       string
	replicas     []string // shared-budget replicas' URLs
	replicaProcs []*benchkit.Process
	single       string // the in-process gateway's URL
	budgetBlocks int64
	blockBytes   int64
	rows         [][]string
	verdicts     []verdict
	oomBefore    float64
	baselineOOM  int64 // out-of-memory events behind the in-process gateway alone
	notes        []string
	redisVersion string
}

type verdict struct {
	ok   bool
	text string
}

// startGateway starts a gateway in front of the simulator, on a free
// port; shared is its shared_budget section ("" for the in-process
// budget).
func (b *bench) startGateway(ctx context.Context, name, shared string) (*benchkit.Process, error) {
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	path, err := b.kit.WriteConfig(name, fmt.Sprintf("listen: %s\nadmission: {reservation: %s}\n%s%sbackends:\n  - {name: gpu0, url: %q, models: [llama-3-8b], gpu_memory: 24GiB}\n%s",
		addr, b.o.reservation, b.tenantsYAML(), benchkit.ModelsYAMLBackendTokenizer, b.simURL, shared))
	if err != nil {
		return nil, err
	}
	return b.kit.Serve(ctx, name, addr, path)
}

func (b *bench) start(ctx context.Context) error {
	var err error
	if b.redis, err = b.kit.StartRedis(ctx, b.o.redisServer, ""); err != nil {
		return err
	}
	b.redisVersion = benchkit.RedisVersion(b.o.redisServer)
	sim, err := b.kit.StartSim(ctx, "sim", "--on-overflow", "oom",
		"--gpu-memory-utilization", "0.75", "--time-scale", strconv.FormatFloat(b.o.timeScale, 'g', -1, 64),
		"--output-len", b.o.outputLen, "--seed", "1")
	if err != nil {
		return err
	}
	b.simURL = sim.URL
	// r2 reaches Redis through a proxy that the bench can cut.
	if b.cut, err = newCutProxy(b.redis.Addr); err != nil {
		return err
	}
	for i := range 3 {
		name := fmt.Sprintf("r%d", i+1)
		url := b.redis.URL
		if i == 1 {
			url = "redis://" + b.cut.addr() + "/0"
		}
		// residual_ttl and residual_release at their defaults: a silent
		// replica's part counts until the backend's figures show its
		// requests gone.
		p, err := b.startGateway(ctx, name, fmt.Sprintf("shared_budget: {redis: %q, replicas: 3, replica: %s}\n", url, name))
		if err != nil {
			return err
		}
		b.replicas = append(b.replicas, p.URL)
		b.replicaProcs = append(b.replicaProcs, p)
	}
	single, err := b.startGateway(ctx, "in-process", "")
	if err != nil {
		return err
	}
	b.single = single.URL
	// The budget as the replicas see it: the simulator's pool, clamped.
	st, err := b.status(b.replicas[0])
	if err != nil {
		return err
	}
	b.blockBytes = 16 * 131072 // Llama-3-8B bf16: 128 KiB a token, 16 tokens a block
	b.budgetBlocks = st.budget / b.blockBytes
	b.oomBefore, err = b.simGauge("kvsim_oom_events_total")
	return err
}
