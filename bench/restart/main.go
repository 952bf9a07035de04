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
//     every restart did before.
//
// The measured step is sized to last about twenty seconds (--requests).
// It prints the table and the acceptance checks: the restarted gateway's
// goodput at least 95 % of steady, and no overflow.
//
//	go run ./bench/restart [--requests 220] [--clients 128] [--time-scale 0.5]
//
// It builds kvgate, starts the simulator and each gateway as a process of
// its own on free loopback ports, and drives them with kvgate loadtest.
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
}

func main() {
	o := options{Flags: benchkit.Register(benchkit.Defaults{TimeScale: 0.5, Seed: 7, Draws: "the prompt and output lengths", Out: true})}
	flag.IntVar(&o.requests, "requests", 220, "requests of each measured step (about twenty seconds of load at the defaults on two cores: 700 took 66 s)")
	flag.IntVar(&o.learn, "learn", 600, "requests the first gateway learns from before it is measured")
	flag.IntVar(&o.clients, "clients", 128, "concurrent clients (saturating: at least 4× what the pool holds at worst case)")
	flag.Parse()
	o.Main("restart", func(ctx context.Context, kit *benchkit.Kit) error { return run(ctx, kit, o) })
}

// row is one measured step.
type row struct {
	name, note string
	benchkit.Step
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

	first, err := kit.StartGateway(ctx, "first", sim.URL, utilization, withFile, "")
	if err != nil {
		return err
	}
	if _, err := load("learn", first.URL, o.learn, 0); err != nil {
		return err
	}
	steady, err := load("steady", first.URL, o.requests, -1)
	first.Stop() // SIGTERM: the file is written at shutdown
	if err != nil {
		return err
	}
	if _, err := os.Stat(file); err != nil {
		return fmt.Errorf("the first gateway left no lengths file: %w", err)
	}
	rows := []row{{"steady", "the first gateway, learned", steady}}
	for _, v := range []struct{ name, note, admission string }{
		{"restarted, lengths file", "starts from the file", withFile},
		{"restarted, cold", "no lengths file", "  reservation: predicted\n"},
	} {
		g, err := kit.StartGateway(ctx, v.name, sim.URL, utilization, v.admission, "")
		if err != nil {
			return err
		}
		st, err := load(v.name, g.URL, o.requests, -1)
		g.Stop()
		if err != nil {
			return err
		}
		rows = append(rows, row{v.name, v.note, st})
	}
	printTable(os.Stdout, rows)
	return nil
}

func printTable(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tgoodput tok/s\tof steady\tstep s\tok\tshed\tfailed\toverflow\tKV mean\tKV peak\t")
	steady := rows[0].Goodput
	for _, r := range rows {
		fmt.Fprintf(tw, "%s (%s)\t%.0f\t%.0f%%\t%.1f\t%d\t%d\t%d\t%.0f\t%.0f%%\t%.0f%%\t\n", r.name, r.note, r.Goodput, 100*r.Goodput/steady,
			r.Window, r.OK, r.Shed, r.Failed, r.Overflow+float64(r.Overflowed), 100*r.KVMean, 100*r.KVPeak)
	}
	tw.Flush()
	fmt.Fprintln(w)
	warm := rows[1]
	benchkit.Check(w, warm.Goodput >= 0.95*steady, "restarted from the lengths file: goodput %.0f%% of steady (>= 95%%)", 100*warm.Goodput/steady)
	ok := true
	for _, r := range rows {
		ok = ok && r.Overflow == 0 && r.Overflowed == 0
	}
	benchkit.Check(w, ok, "no overflow in any row")
}
