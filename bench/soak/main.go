// Command soak runs a fleet of gateways for a long while under faults and
// checks that it comes back to where it started: nothing held, nothing
// queued, no request in flight, goroutines back to their baseline and
// memory flat on every replica, and no GPU ever over-admitted.
//
// It builds kvgate (or uses --kvgate) and starts, each a process of its own
// on loopback: a redis-server (--redis-server; it must be installed); three
// simulated backends of one model, each on a GPU of its own, run with
// --on-overflow oom (a GPU that is over-admitted fails what runs on it and
// counts it), and a fourth kept aside; and three gateway replicas in front
// of them that share each GPU's budget through Redis (shared_budget,
// --lease-ttl 2s), each reaching Redis through a TCP proxy of its own that
// can blackhole it. --concurrency clients spread --requests requests across
// the replicas: chat, completions, the Responses API and Anthropic's
// Messages, each streamed or not, embeddings and reranks, random prompt and
// output lengths, n up to 3, two tenants, a few wrong keys. A share of
// clients hang up at a random moment (queued, waiting, or mid-stream), and
// a share half-close: they send the request over a raw HTTP/1.1 connection,
// shut their sending side and read the answer.
//
// Faults, each at a fixed point of the run and under load:
//   - sim2 removed by a reload of every replica and re-added by the next
//     while its requests still run;
//   - sim3, the fourth simulator, added by a reload, and later removed;
//   - sim1 killed (SIGKILL) and, later, restarted on its port;
//   - replica r2 paused (SIGSTOP) past its lease's TTL, then resumed —
//     the clients leave it while it is paused, as a load balancer would;
//   - replica r3's connection to Redis blackholed past the TTL, then
//     healed;
//   - the configuration reloaded (SIGHUP to every replica) every
//     --reload-every requests, once with a broken file, which must be
//     refused and counted.
//
// Every answer is judged by its API's rules: a 200 must be whole (a
// complete JSON answer, or a stream that ends with its API's end: [DONE],
// response.completed or message_stop, or with an error event), any other
// status must carry an error in its API's shape naming a reason (OpenAI's
// error.code or type, Anthropic's error.type). It prints one table of
// figures — status codes and reasons, per route and per replica — and the
// checks, per replica and fleet-wide, and exits 1 if any fails.
//
// main.go starts the parts, config.go writes the replicas' configs and
// reloads them, load.go and halfclose.go are the clients, answer.go judges
// an answer, tally.go counts what the clients saw, faults.go schedules the
// faults, rest.go reads a replica at rest and report.go prints the figures
// and the checks.
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
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
	"github.com/kvgate/kvgate/internal/holeproxy"
)

type options struct {
	*benchkit.Flags
	redisServer                        string
	requests, concurrency, reloadEvery int
	cancelRate, halfCloseRate          float64
	leaseTTL                           time.Duration
	timeout                            time.Duration
}

func main() {
	o := options{Flags: benchkit.Register(benchkit.Defaults{TimeScale: 0.02, Seed: 1, Draws: "the request mix, the cancels and the half-closes"})}
	flag.StringVar(&o.redisServer, "redis-server", "redis-server", "the redis-server binary")
	flag.IntVar(&o.requests, "requests", 100000, "requests to send")
	flag.IntVar(&o.concurrency, "concurrency", 64, "concurrent clients")
	flag.IntVar(&o.reloadEvery, "reload-every", 0, "send SIGHUP to every replica every this many requests (default: a tenth of --requests)")
	flag.Float64Var(&o.cancelRate, "cancel-rate", 0.05, "share of requests whose client hangs up at a random moment")
	flag.Float64Var(&o.halfCloseRate, "half-close-rate", 0.03, "share of requests whose client half-closes its connection once it has sent the request")
	flag.DurationVar(&o.leaseTTL, "lease-ttl", 2*time.Second, "shared_budget.lease_ttl of the replicas; the pause and the blackhole last it and 1.5s more")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up after this long")
	flag.Parse()
	if o.reloadEvery == 0 {
		o.reloadEvery = o.requests / 10
	}
	if o.requests < 1000 || o.concurrency < 1 || o.reloadEvery < 1 || o.cancelRate < 0 || o.halfCloseRate < 0 || o.cancelRate+o.halfCloseRate > 1 || o.leaseTTL < 100*time.Millisecond {
		fmt.Fprintln(os.Stderr, "soak: --requests must be >= 1000, --concurrency and --reload-every >= 1, --cancel-rate and --half-close-rate in [0, 1] and together at most 1, --lease-ttl at least 100ms")
		os.Exit(2)
	}
	o.Main("soak", func(ctx context.Context, kit *benchkit.Kit) error { return (&soak{o: o, kit: kit}).run(ctx) })
}

// nSims is how many simulators run: three in the configuration from the
// start, the fourth added and removed by reloads.
const nSims = 4

// sim is one simulated backend.
type sim struct {
	name, addr string
	proc       *benchkit.Process
	oomBefore  float64 // out-of-memory events of its earlier lives (before a SIGKILL)
	peakBefore float64 // the highest KV use of its earlier lives
}

// replica is one gateway of the fleet.
type replica struct {
	name, addr, url string
	cfg             string
	proc            *benchkit.Process
	proxy           *holeproxy.Proxy // its way to Redis
	down            atomic.Bool      // out of the clients' rotation (paused)

	reloadsOK, reloadsBad int
	base, end             atRest
	series                []sample
}

type soak struct {
	o        options
	kit      *benchkit.Kit
	redis    *benchkit.Process
	sims     [nSims]*sim
	inConfig [nSims]bool // which simulators the configuration lists
	replicas []*replica
	gen      int // configuration generation, varied by each good reload
	client   *http.Client
	tally    tally
	faults   []string // what was done, for the report
	// gpuBudget is a GPU's budget as the replicas see it
	gpuBudget int64
	loadTime  time.Duration

	checks []check
}

func (s *soak) run(ctx context.Context) error {
	bin, err := exec.LookPath(s.o.redisServer)
	if err != nil {
		return fmt.Errorf("%s is required and was not found (apt-get install redis-server): %w", s.o.redisServer, err)
	}
	fmt.Printf("soak: logs and config in %s\n", s.kit.Dir)
	s.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * s.o.concurrency, MaxIdleConns: 12 * s.o.concurrency}}
	s.tally.init()
	if err := s.start(ctx, bin); err != nil {
		return err
	}
	defer func() {
		for _, r := range s.replicas {
			r.proxy.Close()
		}
	}()
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
	if err := s.restAll(ctx, func(r *replica) *atRest { return &r.base }); err != nil {
		return fmt.Errorf("after warm-up: %w", err)
	}
	for _, r := range s.replicas {
		fmt.Printf("soak: %s baseline after %d warm-up requests: %d goroutines, RSS %s\n", r.name, warm, int(r.base.goroutines), mib(r.base.rss))
	}

	sched := s.schedule(runCtx, warm)
	var faultErr error
	var faultMu sync.Mutex
	event := func(i int) {
		f := sched[i]
		if f == nil {
			return
		}
		faultMu.Lock()
		defer faultMu.Unlock()
		if err := f(); err != nil && faultErr == nil {
			faultErr = fmt.Errorf("request %d: %w", i, err)
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
	restErr := s.restAll(ctx, func(r *replica) *atRest { return &r.end })
	return s.report(restErr, time.Since(begin))
}

// start starts Redis, the simulators, a proxy to Redis per replica and the
// replicas.
func (s *soak) start(ctx context.Context, redisBin string) error {
	var err error
	if s.redis, err = s.kit.StartRedis(ctx, redisBin, ""); err != nil {
		return err
	}
	for i := range s.sims {
		s.sims[i] = &sim{name: fmt.Sprintf("sim%d", i)}
		if s.sims[i].addr, err = benchkit.FreeAddr(); err != nil {
			return err
		}
		if err := s.startSim(ctx, i); err != nil {
			return err
		}
		s.inConfig[i] = i < 3
	}
	for i := range 3 {
		r := &replica{name: fmt.Sprintf("r%d", i+1)}
		if r.addr, err = benchkit.FreeAddr(); err != nil {
			return err
		}
		r.url = "http://" + r.addr
		if r.proxy, err = holeproxy.Start(s.redis.Addr); err != nil {
			return err
		}
		s.replicas = append(s.replicas, r)
		if err := s.writeConfig(r, false); err != nil {
			return err
		}
		if r.proc, err = s.kit.Serve(ctx, r.name, r.addr, r.cfg); err != nil {
			return err
		}
	}
	if st, err := s.status(s.replicas[0]); err == nil && st.SharedBudget != nil && len(st.SharedBudget.GPUs) > 0 {
		s.gpuBudget = st.SharedBudget.GPUs[0].Budget
	}
	return nil
}
