// Command fleet measures what kvgate gets out of several GPUs behind one
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
//	go run ./bench/fleet [--requests 3000] [--clients-per-backend 128] [--time-scale 0.5]
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
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	requests   int
	perBackend int
	backends   int
	timeScale  float64
	killAt     float64
	out        string
	kvgate     string
	seed       uint64
}

func main() {
	var o options
	flag.IntVar(&o.requests, "requests", 3000, "counted requests of each configuration (the same workload in each)")
	flag.IntVar(&o.perBackend, "clients-per-backend", 128, "concurrent clients per backend (at least 4× what a pool holds at worst case)")
	flag.IntVar(&o.backends, "backends", 3, "backends of the fleet")
	flag.Float64Var(&o.timeScale, "time-scale", 0.5, "simulator wall time per simulated time (0.5: twice as fast as a real GPU)")
	flag.Float64Var(&o.killAt, "kill-at", 0.3, "share of the run's requests answered when one simulator is killed in (c)")
	flag.StringVar(&o.out, "out", "", "directory for the load tester's JSON reports, the configs and the logs (default: a temporary one)")
	flag.StringVar(&o.kvgate, "kvgate", "", "kvgate binary (default: go build ./cmd/kvgate)")
	flag.Uint64Var(&o.seed, "seed", 7, "seed of the prompt and output lengths")
	flag.Parse()
	if o.requests < 100 || o.perBackend < 1 || o.backends < 2 || o.timeScale <= 0 || o.killAt <= 0 || o.killAt >= 0.8 {
		fmt.Fprintln(os.Stderr, "fleet: --requests must be >= 100, --clients-per-backend >= 1, --backends >= 2, --time-scale > 0, --kill-at in (0, 0.8)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// setup is one configuration of the run.
type setup struct {
	name     string
	backends int
	kill     bool // SIGKILL the last simulator mid-run
}

func run(ctx context.Context, o options) (bool, error) {
	kit, err := benchkit.New(ctx, "kvgate-fleet-", o.out, o.kvgate)
	if err != nil {
		return false, err
	}
	prompts := kit.Path("prompts.txt")
	if err := benchkit.WritePromptLengths(prompts, o.seed); err != nil {
		return false, err
	}
	fmt.Printf("kvgate fleet benchmark: %s, %d CPUs, %s; %d requests a configuration, %d clients a backend, simulator time scale %g\n",
		runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02 15:04 MST"), o.requests, o.perBackend, o.timeScale)
	fmt.Printf("reports and logs: %s\n\n", kit.Dir)
	setups := []setup{
		{name: "one backend", backends: 1},
		{name: fmt.Sprintf("%d backends", o.backends), backends: o.backends},
		{name: fmt.Sprintf("%d backends, one killed", o.backends), backends: o.backends, kill: true},
	}
	var rows []*result
	for _, s := range setups {
		r, err := measure(ctx, kit, o, s, prompts)
		if err != nil {
			return false, err
		}
		rows = append(rows, r)
	}
	printTable(os.Stdout, o, rows)
	fmt.Println()
	return printChecks(os.Stdout, rows), nil
}

// result is one configuration's figures.
type result struct {
	setup
	clients int
	load    string        // the machine's load average as the run ended (Linux)
	step    benchkit.Step // kvgate loadtest's, over its whole step
	poolFit float64       // requests a pool holds at their worst case, on average

	// From the samples.
	window      [2]time.Duration // the saturated window (after the kill in (c))
	goodput     float64          // answered output tokens/s over window
	kvMean      float64          // KV use of the live simulators over window
	kvPeak      float64          // the highest any simulator reached
	overflow    float64          // out-of-memory events, every simulator
	killedAt    time.Duration    // (c): since the load started
	noticed     time.Duration    // (c): kill to the gateway taking the backend out of routing
	boundAround float64          // (c): admissions to the dead GPU from the kill to a second after it left routing
	boundAfter  float64          // (c): admissions to it later than that

	// From the gateway's /metrics at the end, and its log.
	queueTimeouts float64
	noBackend     float64 // 503 no_healthy_backend
	noRouteWaits  float64 // waiters refused with no_route
	noRouteSlow   float64 // of them, after more than a second
	moved         int     // requests moved to another GPU before their first byte
	lostMidStream float64 // streams cut by the dead backend
}

// measure runs one configuration: simulators, a gateway, the load, the
// samples.
func measure(ctx context.Context, kit *benchkit.Kit, o options, s setup, prompts string) (*result, error) {
	r := &result{setup: s, clients: o.perBackend * s.backends}
	slug := benchkit.Slug(s.name)
	sims := make([]*benchkit.Process, s.backends)
	for i := range sims {
		p, err := kit.StartSim(ctx, fmt.Sprintf("%s-sim%d", slug, i), "--on-overflow", "oom", "--gpu-memory-utilization", utilization,
			"--time-scale", strconv.FormatFloat(o.timeScale, 'g', -1, 64), "--seed", strconv.FormatUint(o.seed+uint64(i), 10),
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
		Seed: o.seed, Strict: true})
	stopSampling()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	r.load = loadAverage()
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
	port, err := benchkit.FreePort()
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, `listen: 127.0.0.1:%d
server: {request_timeout: 30m}
admission:
  ceiling: %s
  queue: {timeout: 20m}
%sbackends:
`, port, utilization, benchkit.ModelsYAML)
	for i, s := range sims {
		fmt.Fprintf(&b, "  - {name: sim%d, url: '%s', models: [%s], gpu_memory: 24GiB, health: {interval: 250ms, failures: 2}}\n", i, s.URL, model)
	}
	path := kit.Path(slug + ".yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	return kit.Start(ctx, slug+"-gateway", fmt.Sprintf("http://127.0.0.1:%d", port), "serve", "--config", path)
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

// sample is one look at the gateway and the simulators.
type sample struct {
	at       time.Duration
	inflight float64
	ok       float64   // requests answered, warm-up included
	tokens   float64   // output tokens of answered requests
	kv       []float64 // each simulator's own KV use (share of its pool); NaN once dead
	routed   []float64 // kvgate_backend_up per backend
	admitted []float64 // kvgate_admissions_total per GPU
	// The gateway's view of each GPU: what it has committed (the forecast
	// peak) and what its backend last reported in use, as shares of its
	// budget.
	committed, used []float64
}

// sampler scrapes the gateway and every simulator each interval, and kills
// the victim once killAfter requests were answered.
type sampler struct {
	client    *http.Client
	gateway   string
	sims      []*benchkit.Process
	start     time.Time
	killAfter float64 // 0: kill nobody
	victim    int

	// Written by run, read once it has returned.
	samples []sample
	killed  time.Duration // -1 until the kill
	peak    []float64     // kvsim_kv_usage_peak_ratio, last seen per simulator
	ooms    []float64     // kvsim_oom_events_total, last seen per simulator
	errs    int
}

func (s *sampler) run(ctx context.Context) {
	s.killed = -1
	s.peak, s.ooms = make([]float64, len(s.sims)), make([]float64, len(s.sims))
	dead := make([]bool, len(s.sims))
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n := len(s.sims)
		sm := sample{at: time.Since(s.start), kv: make([]float64, n), routed: make([]float64, n),
			admitted: make([]float64, n), committed: make([]float64, n), used: make([]float64, n)}
		gm, err := benchkit.Scrape(ctx, s.client, s.gateway+"/metrics")
		if err == nil {
			sm.inflight = gm.Sum("kvgate_requests_in_flight")
			sm.ok = gm.Sum("kvgate_requests_total", `outcome="ok"`)
			sm.tokens = gm.Sum("kvgate_tokens_actual_total", `kind="output"`)
			for i := range s.sims {
				sm.routed[i] = gm.Sum("kvgate_backend_up", fmt.Sprintf(`backend="sim%d"`, i))
				gpu := fmt.Sprintf(`gpu="sim%d"`, i)
				sm.admitted[i] = gm.Sum("kvgate_admissions_total", gpu)
				if c := gm.Sum("kvgate_kv_capacity_bytes", gpu); c > 0 {
					sm.committed[i] = gm.Sum("kvgate_kv_committed_bytes", gpu) / c
					sm.used[i] = gm.Sum("kvgate_kv_used_bytes", gpu) / c
				}
			}
		}
		for i, p := range s.sims {
			sm.kv[i] = math.NaN()
			if dead[i] {
				continue
			}
			m, err := benchkit.Scrape(ctx, s.client, p.URL+"/metrics")
			if err != nil {
				s.errs++
				continue
			}
			sm.kv[i] = m.Sum("vllm:kv_cache_usage_perc")
			s.peak[i] = m.Sum("kvsim_kv_usage_peak_ratio")
			s.ooms[i] = m.Sum("kvsim_oom_events_total")
		}
		if ctx.Err() != nil {
			return // a scrape cut short by the end is no sample
		}
		if err == nil {
			s.samples = append(s.samples, sm)
		}
		if s.killAfter > 0 && s.killed < 0 && err == nil && sm.ok >= s.killAfter {
			s.sims[s.victim].Kill()
			dead[s.victim] = true
			s.killed = time.Since(s.start)
			fmt.Fprintf(os.Stderr, "  SIGKILL sim%d at %.1f s, %.0f requests answered\n", s.victim, s.killed.Seconds(), sm.ok)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// writeCSV writes the samples, one a line, for a closer look at a run.
func (s *sampler) writeCSV(path string) error {
	var b strings.Builder
	b.WriteString("t_s,in_flight,answered,output_tokens")
	for i := range s.sims {
		fmt.Fprintf(&b, ",sim%[1]d_kv,sim%[1]d_routed,sim%[1]d_admitted,sim%[1]d_committed,sim%[1]d_used", i)
	}
	b.WriteByte('\n')
	for _, sm := range s.samples {
		fmt.Fprintf(&b, "%.3f,%g,%g,%g", sm.at.Seconds(), sm.inflight, sm.ok, sm.tokens)
		for i := range s.sims {
			fmt.Fprintf(&b, ",%.4f,%g,%g,%.4f,%.4f", sm.kv[i], sm.routed[i], sm.admitted[i], sm.committed[i], sm.used[i])
		}
		b.WriteByte('\n')
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// read turns the samples and the gateway's final metrics into r's figures.
func (r *result) read(s *sampler, end benchkit.Metrics) error {
	// The saturated span: every client has a request in flight (queued or
	// running) — before the last requests are sent, after the first ones.
	first, last := -1, -1
	for i, sm := range s.samples {
		if sm.inflight >= 0.95*float64(r.clients) {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 || last-first < 8 {
		return fmt.Errorf("never saturated: fewer than 2 s with all %d clients in flight (more --requests?)", r.clients)
	}
	t0, t1 := s.samples[first].at, s.samples[last].at
	from, to := t0+(t1-t0)/5, t0+(t1-t0)*4/5
	if r.kill {
		r.killedAt = s.killed
		if s.killed >= to {
			return fmt.Errorf("the kill at %.1f s came after the saturated window ended at %.1f s (lower --kill-at)", s.killed.Seconds(), to.Seconds())
		}
		from = s.killed
	}
	r.window = [2]time.Duration{from, to}
	a, b := s.at(from), s.at(to)
	if b.at <= a.at {
		return errors.New("no samples in the saturated window")
	}
	r.goodput = (b.tokens - a.tokens) / (b.at - a.at).Seconds()

	var kvSum float64
	kvN := 0
	for _, sm := range s.samples {
		if sm.at < from || sm.at > to {
			continue
		}
		for _, u := range sm.kv {
			if !math.IsNaN(u) {
				kvSum += u
				kvN++
			}
		}
	}
	if kvN > 0 {
		r.kvMean = kvSum / float64(kvN)
	}
	// An overflow shows twice: as the simulator's out-of-memory event and
	// as the answers it failed. Either is counted, in case the other was
	// missed (a simulator killed before its last scrape).
	var ooms float64
	for i := range s.peak {
		r.kvPeak = max(r.kvPeak, s.peak[i])
		ooms += s.ooms[i]
	}
	r.overflow = max(ooms, float64(r.step.Overflowed))
	if r.kill {
		v := s.victim
		// Nothing tells the gateway that a backend died before a connection
		// to it fails (a probe's, or a request's): its streams cut by the
		// kill give their budget back first, and waiters bound there in that
		// moment fail to connect and are moved. Its admissions are counted
		// as they are handed over, a little after the bind: the check is
		// that none come a second after the circuit opened.
		r.noticed = -1
		var atKill float64
		for _, sm := range s.samples {
			if sm.at < s.killed {
				atKill = sm.admitted[v]
				continue
			}
			if r.noticed < 0 && sm.routed[v] == 0 {
				r.noticed = sm.at - s.killed
			}
			if r.noticed >= 0 && sm.at >= s.killed+r.noticed+time.Second {
				r.boundAround = sm.admitted[v] - atKill
				r.boundAfter = s.samples[len(s.samples)-1].admitted[v] - sm.admitted[v]
				break
			}
		}
		r.lostMidStream = end.Sum("kvgate_requests_total", `reason="upstream_incomplete"`) + end.Sum("kvgate_requests_total", `reason="upstream_error"`)
	}
	r.queueTimeouts = end.Sum("kvgate_admission_rejections_total", `reason="queue_timeout"`)
	r.noBackend = end.Sum("kvgate_requests_total", `reason="no_backend"`)
	r.noRouteWaits = end.Sum("kvgate_queue_wait_seconds_count", `result="no_route"`)
	r.noRouteSlow = r.noRouteWaits - bucketAtMost(end, `result="no_route"`, 1)
	return nil
}

// at is the sample nearest to t.
func (s *sampler) at(t time.Duration) sample {
	best := s.samples[0]
	for _, sm := range s.samples {
		if (sm.at - t).Abs() < (best.at - t).Abs() {
			best = sm
		}
	}
	return best
}

var leLabel = regexp.MustCompile(`le="([^"]+)"`)

// bucketAtMost is the count of kvgate_queue_wait_seconds observations with
// labels want in the largest bucket at or under limit seconds.
func bucketAtMost(m benchkit.Metrics, want string, limit float64) float64 {
	bestLE, count := -1.0, 0.0
	for k, v := range m {
		if !strings.HasPrefix(k, "kvgate_queue_wait_seconds_bucket{") || !strings.Contains(k, want) {
			continue
		}
		sm := leLabel.FindStringSubmatch(k)
		if sm == nil {
			continue
		}
		le, err := strconv.ParseFloat(sm[1], 64)
		if err != nil || le > limit {
			continue
		}
		switch {
		case le > bestLE:
			bestLE, count = le, v
		case le == bestLE:
			count += v // the same bucket of another class
		}
	}
	return count
}

// loadAverage is the machine's load average over the last minute, "?"
// where /proc/loadavg cannot say: other work on the machine slows the
// simulators' steps and the gateway, and the figures with them.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// countLines counts the lines of a log that contain s.
func countLines(path, s string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strings.Count(string(data), s), nil
}

func printTable(w io.Writer, o options, rows []*result) {
	fmt.Fprintf(w, "Llama-3-8B on simulated 24 GiB GPUs (pool at 0.9, ceiling 0.9, --on-overflow oom); prompts 90%% ≈256, 10%% ≈4000 tokens;\n")
	fmt.Fprintf(w, "outputs lognormal (median 200, σ 0.8) under max_tokens %d; a pool holds %.0f requests at their worst case, the clients are %.1f× that\n",
		maxTokens, rows[0].poolFit, float64(o.perBackend)/rows[0].poolFit)
	fmt.Fprintf(w, "%-26s %5s %7s %9s %6s %10s %8s %7s %8s %6s %5s %5s %6s %5s\n",
		"configuration", "GPUs", "clients", "goodput", "×one", "whole step", "KV mean", "KV peak", "overflow", "ok", "429", "503", "failed", "load")
	base := rows[0].goodput
	for _, r := range rows {
		gpus := strconv.Itoa(r.backends)
		if r.kill {
			gpus = fmt.Sprintf("%d→%d", r.backends, r.backends-1)
		}
		fmt.Fprintf(w, "%-26s %5s %7d %9.0f %5.2f× %10.0f %7.1f%% %6.1f%% %8.0f %6d %5d %5.0f %6d %5s\n",
			r.name, gpus, r.clients, r.goodput, r.goodput/base, r.step.Goodput, 100*r.kvMean, 100*r.kvPeak,
			r.overflow, r.step.OK, r.step.Shed, r.noBackend, r.step.Failed, r.load)
	}
	fmt.Fprintln(w, "goodput: answered output tokens/s over the saturated window (the gateway's count; after the kill for the last row);")
	fmt.Fprintln(w, "whole step: kvgate loadtest's figure, first request sent to last answered; KV: the simulators' own use of their pools;")
	fmt.Fprintln(w, "overflow: the simulators' out-of-memory events (or answers failed by one, if more); failed: every answer neither 200 nor 429 (the 503s among them);")
	fmt.Fprintln(w, "load: the machine's 1-minute load average as the configuration's run ended")
}

// printChecks states the acceptance bars; it returns whether all
// passed.
func printChecks(w io.Writer, rows []*result) bool {
	one, all, killed := rows[0], rows[1], rows[2]
	ok := true
	check := func(pass bool, format string, a ...any) { ok = benchkit.Check(w, pass, format, a...) && ok }
	fmt.Fprintln(w, "Acceptance (issue \"Many backends, one queue\"):")
	check(all.goodput >= 2.8*one.goodput, "goodput with %d backends %.2f× one backend over the saturated window (≥ 2.8×); %.2f× over the whole step",
		all.backends, all.goodput/one.goodput, all.step.Goodput/one.step.Goodput)
	check(one.overflow == 0 && all.overflow == 0, "zero overflow with one backend (%.0f) and with %d (%.0f)", one.overflow, all.backends, all.overflow)
	check(killed.overflow == 0, "zero overflow with one of %d killed (%.0f)", killed.backends, killed.overflow)
	check(killed.queueTimeouts == 0 && killed.noRouteSlow == 0,
		"no request waited for the dead GPU: %.0f queue timeouts; %.0f waiters refused for want of a backend, %.0f of them after more than a second; %.0f answered 503 no_healthy_backend",
		killed.queueTimeouts, killed.noRouteWaits, killed.noRouteSlow, killed.noBackend)
	check(killed.noticed >= 0 && killed.boundAfter == 0,
		"the dead GPU left routing %.2f s after the SIGKILL and took no request from a second after that (%.0f; %.0f bound in the moment before, each moved); %d requests moved to another GPU before their first byte, %.0f streams cut by the kill",
		killed.noticed.Seconds(), killed.boundAfter, killed.boundAround, killed.moved, killed.lostMidStream)
	check(killed.goodput >= 1.8*one.goodput, "goodput after the kill %.2f× one backend (≥ 1.8×), from the kill at %.1f s to %.1f s",
		killed.goodput/one.goodput, killed.killedAt.Seconds(), killed.window[1].Seconds())
	return ok
}
