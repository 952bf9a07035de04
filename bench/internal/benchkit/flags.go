package benchkit

import (
	"context"
	"flag"
)

// Flags are the flags the benchmarks that start kvgate themselves share.
type Flags struct {
	KVGate    string  // the kvgate binary; "": built from this checkout
	TimeScale float64 // the simulators' --time-scale
	Seed      uint64
	Out       string // the run's directory; "": a temporary one
}

// Defaults are a benchmark's defaults for the shared flags.
type Defaults struct {
	TimeScale float64
	Seed      uint64
	Draws     string // what the seed draws, for -seed's help
	Out       bool   // define -out: the run's files are worth keeping
}

// Register defines -kvgate, -time-scale, -seed and, where d.Out, -out on
// the command line.
func Register(d Defaults) *Flags {
	f := &Flags{}
	flag.StringVar(&f.KVGate, "kvgate", "", "kvgate binary (default: go build ./cmd/kvgate)")
	flag.Float64Var(&f.TimeScale, "time-scale", d.TimeScale, "simulator wall time per simulated time (1: as fast as a real GPU; 0.5: twice as fast)")
	flag.Uint64Var(&f.Seed, "seed", d.Seed, "seed of "+d.Draws)
	if d.Out {
		flag.StringVar(&f.Out, "out", "", "directory for the run's configs, logs and reports (default: a temporary one)")
	}
	return f
}

// Main is the package's Main for the benchmark name, with the run the
// flags describe prepared (see New) and every process it started stopped
// at the end.
func (f *Flags) Main(name string, run func(context.Context, *Kit) error) {
	Main(name, func(ctx context.Context) error {
		kit, err := New(ctx, "kvgate-"+name+"-", f.Out, f.KVGate)
		if err != nil {
			return err
		}
		defer kit.StopAll()
		return run(ctx, kit)
	})
}
