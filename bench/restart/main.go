// Command restart measures what a gateway's restart costs its goodput: a
// gateway with predicted reservations learns a model's output lengths
// under saturating load, is measured there (steady), then stopped and
// started again, and the load resumes at once, every request of the first
// step after the restart counted (no uncounted warm-up). Three rows, in
// front of the same simulated GPU:
//
//   - steady: the first gateway once it has learned;
//   - restarted, lengths file: a new process that starts from the file the
//     first one wrote at shutdown (admission.lengths_file);
//   - restarted, cold: a new process without it, holding the model at its
//     worst case until warmup_samples (100) requests have finished, as
//     every restart did before;
//   - fleet steady and fleet restarted (--fleet, on by default): the same
//     with a replica of shared_budget and no lengths file, which learns,
//     publishes what it learned to Redis, is measured, stopped, and
//     started again under the same replica name: it reads the fleet's
//     lengths from Redis before it admits anything.
//
// The measured step is sized to last about twenty seconds (--requests).
// It prints the table and the acceptance checks: each restarted gateway's
// goodput at least 95 % of its steady, and no overflow.
//
//	go run ./bench/restart [--requests 220] [--clients 128] [--time-scale 0.5] [--fleet=false] [--redis-server redis-server]
//
// It builds kvgate, starts the simulator, redis-server and each gateway as
// a process of its own on free loopback ports, and drives them with kvgate
// loadtest.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// The simulated GPU and workload are bench/goodput's early-stop: Llama-3-8B
// on 24 GiB at utilization 0.9, prompts 90 % ≈256 and 10 % ≈4000 tokens,
// outputs lognormal (median 200, σ 0.8) under max_tokens 1024.
const utilization = "0.9"

type options struct {
	*benchkit.Flags
	requests, learn, clients int
	fleet                    bool
	redisServer              string
}

func main() {
	o := options{Flags: benchkit.Register(benchkit.Defaults{TimeScale: 0.5, Seed: 7, Draws: "the prompt and output lengths", Out: true})}
	flag.IntVar(&o.requests, "requests", 220, "requests of each measured step (about twenty seconds of load at the defaults on two cores: 700 took 66 s)")
	flag.IntVar(&o.learn, "learn", 600, "requests the first gateway learns from before it is measured")
	flag.IntVar(&o.clients, "clients", 128, "concurrent clients (saturating: at least 4× what the pool holds at worst case)")
	flag.BoolVar(&o.fleet, "fleet", true, "also restart a replica with shared_budget, which starts from the fleet's lengths in Redis")
	flag.StringVar(&o.redisServer, "redis-server", "redis-server", "the redis-server binary, for --fleet")
	flag.Parse()
	o.Main("restart", func(ctx context.Context, kit *benchkit.Kit) error { return run(ctx, kit, o) })
}

// row is one measured step; steady is the goodput it is compared with.
type row struct {
	name, note string
	benchkit.Step
	steady float64
	check  bool // its goodput must be at least 95 % of steady
}

func run(ctx context.Context, kit *benchkit.Kit, o options) error {
	kit.Header(os.Stdout, "restart", fmt.Sprintf("%d requests a measured step, every one counted, %d clients, simulator time scale %g", o.requests, o.clients, o.TimeScale), "reports and logs")
	prompts := kit.Path("prompts.txt")
	if err := benchkit.WritePromptLengths(prompts, o.Seed); err != nil {
		return err
	}
	sim, err := kit.StartSim(ctx, "sim", "--on-overflow", "oom", "--gpu-memory-utilization", utilization,
		"--time-scale", strconv.FormatFloat(o.TimeScale, 'g', -1, 64), "--seed", strconv.FormatUint(o.Seed, 10),
		"--model", benchkit.Model, "--output-len", "lognormal:200,0.8")
	if err != nil {
		return err
	}
	defer sim.Stop()
	file := kit.Path("lengths.json")
	withFile := fmt.Sprintf("  reservation: predicted\n  lengths_file: {path: %s, interval: 5s}\n", file)
	load := func(name, url string, requests, warmup int) (benchkit.Step, error) {
		steps, err := kit.Load(ctx, benchkit.Load{Name: name, Target: url, MetricsURL: sim.URL + "/metrics", Model: benchkit.Model,
			Levels: strconv.Itoa(o.clients), Requests: requests, Warmup: warmup, Prompts: prompts, Outputs: "fixed:1024",
			Seed: o.Seed, Strict: true})
		if err != nil {
			return benchkit.Step{}, err
		}
		return steps[0], nil
	}

	// learned starts a gateway, lets it learn and measures it: steady. It
	// is stopped (SIGTERM) when it returns.
	learned := func(name, admission, top string) (benchkit.Step, error) {
		g, err := kit.StartGateway(ctx, name, sim.URL, utilization, admission, top)
		if err != nil {
			return benchkit.Step{}, err
		}
		defer g.Stop()
		if _, err := load(name+" learn", g.URL, o.learn, 0); err != nil {
			return benchkit.Step{}, err
		}
		return load(name, g.URL, o.requests, -1)
	}
	// restarted starts a gateway and measures its first step at once.
	restarted := func(name, admission, top string) (benchkit.Step, error) {
		g, err := kit.StartGateway(ctx, name, sim.URL, utilization, admission, top)
		if err != nil {
			return benchkit.Step{}, err
		}
		defer g.Stop()
		return load(name, g.URL, o.requests, -1)
	}

	steady, err := learned("steady", withFile, "") // the file is written at shutdown
	if err != nil {
		return err
	}
	if _, err := os.Stat(file); err != nil {
		return fmt.Errorf("the first gateway left no lengths file: %w", err)
	}
	rows := []row{{"steady", "the first gateway, learned", steady, steady.Goodput, false}}
	for _, v := range []struct {
		name, note, admission string
		check                 bool
	}{
		{"restarted, lengths file", "starts from the file", withFile, true},
		{"restarted, cold", "no lengths file", "  reservation: predicted\n", false},
	} {
		st, err := restarted(v.name, v.admission, "")
		if err != nil {
			return err
		}
		rows = append(rows, row{v.name, v.note, st, steady.Goodput, v.check})
	}
	if o.fleet {
		redis, err := kit.StartRedis(ctx, o.redisServer, "")
		if err != nil {
			return fmt.Errorf("--fleet needs redis-server (apt-get install redis-server, or --fleet=false): %w", err)
		}
		defer redis.Stop()
		shared := fmt.Sprintf("shared_budget: {redis: %q, replicas: 1, replica: r1}\n", redis.URL)
		predicted := "  reservation: predicted\n"
		fleetSteady, err := learned("fleet steady", predicted, shared)
		if err != nil {
			return err
		}
		st, err := restarted("fleet restarted", predicted, shared)
		if err != nil {
			return err
		}
		rows = append(rows, row{"fleet steady", "a shared_budget replica, learned", fleetSteady, fleetSteady.Goodput, false},
			row{"fleet restarted", "starts from the lengths in Redis", st, fleetSteady.Goodput, true})
	}
	printTable(os.Stdout, rows)
	return nil
}

func printTable(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tgoodput tok/s\tof steady\tstep s\tok\tshed\tfailed\toverflow\tKV mean\tKV peak\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s (%s)\t%.0f\t%.0f%%\t%.1f\t%d\t%d\t%d\t%.0f\t%.0f%%\t%.0f%%\t\n", r.name, r.note, r.Goodput, 100*r.Goodput/r.steady,
			r.Window, r.OK, r.Shed, r.Failed, r.Overflow+float64(r.Overflowed), 100*r.KVMean, 100*r.KVPeak)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, r := range rows {
		if r.check {
			benchkit.Check(w, r.Goodput >= 0.95*r.steady, "%s (%s): goodput %.0f%% of steady (>= 95%%)", r.name, r.note, 100*r.Goodput/r.steady)
		}
	}
	ok := true
	for _, r := range rows {
		ok = ok && r.Overflow == 0 && r.Overflowed == 0
	}
	benchkit.Check(w, ok, "no overflow in any row")
}
