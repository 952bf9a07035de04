// Command soak runs the gateway for a long while under faults and checks
// that it comes back to where it started: nothing held, nothing queued, no
// request in flight, goroutines back to their baseline and memory flat.
//
// It builds kvgate (or uses --kvgate), starts three simulated backends of
// one model, each on a GPU of its own, and the gateway in front of them as
// separate processes, and sends --requests
// requests from --concurrency clients: chat and completions, streamed and
// not, n up to 3, random prompt and output lengths, two tenants, a few
// wrong keys. Meanwhile a share of clients hang up at a random moment
// (queued, waiting, or mid-stream), one backend is killed (SIGKILL) and
// restarted on its port, and the configuration is reloaded with SIGHUP
// (one reload is a broken file, which must be refused and counted). It
// prints one table of figures and exits 1 if any check fails.
//
//	go run ./bench/soak                    # 100k requests
//	go run ./bench/soak --requests 20000   # a shorter run
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

type options struct {
	*benchkit.Flags
	requests, concurrency, reloadEvery int
	cancelRate                         float64
	timeout                            time.Duration
}

func main() {
	o := options{Flags: benchkit.Register(benchkit.Defaults{TimeScale: 0.001, Seed: 1, Draws: "the request mix and the cancels"})}
	flag.IntVar(&o.requests, "requests", 100000, "requests to send")
	flag.IntVar(&o.concurrency, "concurrency", 64, "concurrent clients")
	flag.IntVar(&o.reloadEvery, "reload-every", 10000, "send SIGHUP every this many requests")
	flag.Float64Var(&o.cancelRate, "cancel-rate", 0.05, "share of requests whose client hangs up at a random moment")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up after this long")
	flag.Parse()
	if o.requests < 1000 || o.concurrency < 1 || o.reloadEvery < 1 || o.cancelRate < 0 || o.cancelRate > 1 {
		fmt.Fprintln(os.Stderr, "soak: --requests must be >= 1000, --concurrency and --reload-every >= 1, --cancel-rate in [0, 1]")
		os.Exit(2)
	}
	o.Main("soak", func(ctx context.Context, kit *benchkit.Kit) error { return (&soak{o: o, kit: kit}).run(ctx) })
}

type soak struct {
	o      options
	kit    *benchkit.Kit
	cfg    string
	gwURL  string
	sims   [3]*benchkit.Process
	simAt  [3]string
	gw     *benchkit.Process
	client *http.Client

	// tallies of what clients saw
	codes    sync.Map // status code → *atomic.Int64
	canceled atomic.Int64
	broken   atomic.Int64 // a 200 stream that ended without [DONE] or an error event
	netErrs  atomic.Int64 // transport errors not caused by our own cancel
	sent     atomic.Int64
	loadTime time.Duration // spent sending, without the pauses at rest

	checks []check
}

func (s *soak) run(ctx context.Context) error {
	var err error
	fmt.Printf("soak: logs and config in %s\n", s.kit.Dir)
	s.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * s.o.concurrency, MaxIdleConns: 4 * s.o.concurrency}}
	for i := range s.simAt {
		if s.simAt[i], err = benchkit.FreeAddr(); err != nil {
			return err
		}
		if err := s.startSim(ctx, i); err != nil {
			return err
		}
	}
	gwAddr, err := benchkit.FreeAddr()
	if err != nil {
		return err
	}
	s.gwURL = "http://" + gwAddr
	if err := s.writeConfig(0, false); err != nil {
		return err
	}
	if s.gw, err = s.kit.Serve(ctx, "gateway", gwAddr, s.cfg); err != nil {
		return err
	}
	// The processes live as long as the run; the load has its own limit.
	runCtx := ctx

	ctx, cancel := context.WithTimeout(ctx, s.o.timeout)
	defer cancel()
	begin := time.Now()

	// Warm up, then take the baseline at rest.
	warm := s.o.requests / 20
	loadStart := time.Now()
	if err := s.load(ctx, 0, warm, nil); err != nil {
		return err
	}
	s.loadTime += time.Since(loadStart)
	base, err := s.rest(ctx)
	if err != nil {
		return fmt.Errorf("after warm-up: %w", err)
	}
	base.goroutines = s.settledGoroutines()
	fmt.Printf("soak: baseline after %d warm-up requests: %d goroutines, RSS %s\n", warm, int(base.goroutines), mib(base.rss))

	// The run, with its faults at fixed points.
	// The broken reload falls between two good ones: SIGHUPs sent together
	// may be read as one.
	killAt, restartAt := s.o.requests/4, s.o.requests*2/5
	badAt := s.o.requests/2/s.o.reloadEvery*s.o.reloadEvery + s.o.reloadEvery/2
	var rssSeries []sample
	var reloadsOK, reloadsBad int
	var faultErr error
	var faultMu sync.Mutex
	sampleEvery := s.o.requests / 10
	event := func(i int) {
		isEvent := i == killAt || i == restartAt || i == badAt || i > warm && (i%s.o.reloadEvery == 0 || i%sampleEvery == 0)
		if !isEvent {
			return
		}
		faultMu.Lock()
		defer faultMu.Unlock()
		fail := func(err error) {
			if faultErr == nil {
				faultErr = err
			}
		}
		switch i {
		case killAt:
			fmt.Printf("soak: request %d: SIGKILL sim1\n", i)
			s.sims[1].Kill()
		case restartAt:
			fmt.Printf("soak: request %d: restarting sim1\n", i)
			if err := s.startSim(runCtx, 1); err != nil {
				fail(err)
			}
		case badAt:
			fmt.Printf("soak: request %d: SIGHUP with a broken config\n", i)
			if err := s.writeConfig(0, true); err != nil {
				fail(err)
			}
			reloadsBad++
			if err := s.hup(`result="error"`, reloadsBad); err != nil {
				fail(err)
			}
		}
		if i > warm && i%s.o.reloadEvery == 0 {
			if err := s.writeConfig(i/s.o.reloadEvery, false); err != nil {
				fail(err)
			}
			reloadsOK++
			if err := s.hup(`result="ok"`, reloadsOK); err != nil {
				fail(err)
			}
		}
		if i > warm && i%sampleEvery == 0 {
			if m, err := s.metrics(); err == nil {
				rssSeries = append(rssSeries, sample{at: i, rss: m["process_resident_memory_bytes"], goroutines: m["go_goroutines"]})
			}
		}
	}
	loadStart = time.Now()
	if err := s.load(ctx, warm, s.o.requests, event); err != nil {
		return err
	}
	s.loadTime += time.Since(loadStart)
	if faultErr != nil {
		return faultErr
	}
	end, err := s.rest(ctx)
	if err != nil {
		return fmt.Errorf("at the end: %w", err)
	}
	elapsed := time.Since(begin)
	return s.report(base, end, rssSeries, reloadsOK, reloadsBad, elapsed)
}
