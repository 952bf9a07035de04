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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

type options struct {
	requests, concurrency, reloadEvery int
	cancelRate, timeScale              float64
	kvgate                             string
	seed                               uint64
	timeout                            time.Duration
}

func main() {
	var o options
	flag.IntVar(&o.requests, "requests", 100000, "requests to send")
	flag.IntVar(&o.concurrency, "concurrency", 64, "concurrent clients")
	flag.IntVar(&o.reloadEvery, "reload-every", 10000, "send SIGHUP every this many requests")
	flag.Float64Var(&o.cancelRate, "cancel-rate", 0.05, "share of requests whose client hangs up at a random moment")
	flag.Float64Var(&o.timeScale, "time-scale", 0.001, "the simulators' --time-scale")
	flag.StringVar(&o.kvgate, "kvgate", "", "kvgate binary (default: built from this checkout)")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the request mix and the cancels")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up after this long")
	flag.Parse()
	if o.requests < 1000 || o.concurrency < 1 || o.reloadEvery < 1 || o.cancelRate < 0 || o.cancelRate > 1 {
		fmt.Fprintln(os.Stderr, "soak: --requests must be >= 1000, --concurrency and --reload-every >= 1, --cancel-rate in [0, 1]")
		os.Exit(2)
	}
	s := &soak{o: o}
	err := s.run()
	s.stopAll()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

type soak struct {
	o      options
	dir    string
	bin    string
	cfg    string
	gwURL  string
	sims   [3]*proc
	simAt  [3]string
	gw     *proc
	client *http.Client

	mu    sync.Mutex // guards procs
	procs []*proc

	// tallies of what clients saw
	codes    sync.Map // status code → *atomic.Int64
	canceled atomic.Int64
	broken   atomic.Int64 // a 200 stream that ended without [DONE] or an error event
	netErrs  atomic.Int64 // transport errors not caused by our own cancel
	sent     atomic.Int64
	loadTime time.Duration // spent sending, without the pauses at rest

	checks []check
}

type check struct {
	name string
	ok   bool
	info string
}

func (s *soak) check(name string, ok bool, format string, a ...any) {
	s.checks = append(s.checks, check{name, ok, fmt.Sprintf(format, a...)})
}

// proc is a child process, killed by its pid at the end.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func (s *soak) start(name string, args ...string) (*proc, error) {
	logf, err := os.Create(filepath.Join(s.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(p.done) }()
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p, nil
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) kill() {
	if p.alive() {
		p.cmd.Process.Kill()
		<-p.done
	}
}

func (s *soak) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		if p.alive() {
			p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				p.kill()
			}
		}
	}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (s *soak) waitHTTP(url string, want int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := s.client.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == want {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer %d within %s (last: %v)", url, want, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *soak) startSim(i int) error {
	p, err := s.start(fmt.Sprintf("sim%d", i), "sim", "--listen", s.simAt[i], "--time-scale", strconv.FormatFloat(s.o.timeScale, 'g', -1, 64),
		"--gpu-memory-utilization", "0.75", "--seed", strconv.Itoa(i+1))
	if err != nil {
		return err
	}
	s.sims[i] = p
	return s.waitHTTP("http://"+s.simAt[i]+"/health", 200, 30*time.Second)
}

// writeConfig writes the gateway's config; gen varies a harmless value so
// that each reload really changes something. A broken config has an
// unknown key.
func (s *soak) writeConfig(gen int, broken bool) error {
	extra := ""
	if broken {
		extra = "    max_request: 1\n"
	}
	y := fmt.Sprintf(`listen: %s
admission:
  queue:
    timeout: %ds
%stenants:
  - {name: alpha, api_keys: [key-alpha], share: 0.7}
  - {name: beta, api_keys: [key-beta], share: 0.7, class: sheddable}
%sbackends:
%slog: {level: warn}
`, strings.TrimPrefix(s.gwURL, "http://"), 20+gen%2, extra, benchkit.ModelsYAML, s.backendsYAML())
	tmp := s.cfg + ".tmp"
	if err := os.WriteFile(tmp, []byte(y), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, s.cfg)
}

// backendsYAML lists the simulators, each on a GPU of its own.
func (s *soak) backendsYAML() string {
	var b strings.Builder
	for i, at := range s.simAt {
		fmt.Fprintf(&b, "  - {name: sim%d, url: 'http://%s', models: [llama-3-8b], gpu_memory: 24GiB, health: {interval: 200ms, failures: 2, cooldown: 1s}, metrics: {interval: 200ms}}\n", i, at)
	}
	return b.String()
}

func (s *soak) run() error {
	var err error
	if s.dir, err = os.MkdirTemp("", "kvgate-soak-"); err != nil {
		return err
	}
	fmt.Printf("soak: logs and config in %s\n", s.dir)
	s.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * s.o.concurrency, MaxIdleConns: 4 * s.o.concurrency}}
	s.bin = s.o.kvgate
	if s.bin == "" {
		s.bin = filepath.Join(s.dir, "kvgate")
		build := exec.Command("go", "build", "-o", s.bin, "./cmd/kvgate")
		build.Stderr = os.Stderr
		if os.Getenv("CGO_CFLAGS") == "" { // go-nvml's header warns about deprecated calls otherwise
			build.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
		}
		if err := build.Run(); err != nil {
			return fmt.Errorf("build kvgate (run from the repository root, or pass --kvgate): %w", err)
		}
	}
	for i := range s.simAt {
		if s.simAt[i], err = freeAddr(); err != nil {
			return err
		}
		if err := s.startSim(i); err != nil {
			return err
		}
	}
	gwAddr, err := freeAddr()
	if err != nil {
		return err
	}
	s.gwURL = "http://" + gwAddr
	s.cfg = filepath.Join(s.dir, "kvgate.yaml")
	if err := s.writeConfig(0, false); err != nil {
		return err
	}
	if s.gw, err = s.start("gateway", "serve", "--config", s.cfg); err != nil {
		return err
	}
	if err := s.waitHTTP(s.gwURL+"/readyz", 200, 30*time.Second); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), s.o.timeout)
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
			s.sims[1].kill()
		case restartAt:
			fmt.Printf("soak: request %d: restarting sim1\n", i)
			if err := s.startSim(1); err != nil {
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

// hup sends SIGHUP and waits until the gateway has counted the reload:
// kvgate_config_reloads_total{result} reaching want.
func (s *soak) hup(result string, want int) error {
	s.gw.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m, err := s.metrics(); err == nil && m.Sum("kvgate_config_reloads_total", result) >= float64(want) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("reload %d (%s) not counted within 10s", want, result)
}

type sample struct {
	at              int
	rss, goroutines float64
}

// load sends requests [from, to) from the clients; event runs (in one
// client) as request i is sent.
func (s *soak) load(ctx context.Context, from, to int, event func(i int)) error {
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	for w := range s.o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(s.o.seed, uint64(w)))
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				if event != nil {
					event(i)
				}
				s.one(ctx, rng)
			}
		}()
	}
	wg.Wait()
	return ctx.Err()
}

const words = " the of KV cache block token budget gateway request stream prompt output memory"

// one sends one random request and tallies what came back.
func (s *soak) one(ctx context.Context, rng *rand.Rand) {
	s.sent.Add(1)
	chat := rng.IntN(2) == 0
	stream := rng.IntN(2) == 0
	n := 1
	if rng.IntN(10) == 0 {
		n = 2 + rng.IntN(2)
	}
	var prompt strings.Builder
	for range 5 + rng.IntN(400) {
		w := strings.Fields(words)
		prompt.WriteString(" " + w[rng.IntN(len(w))])
	}
	body := map[string]any{"model": "llama-3-8b", "max_tokens": 1 + rng.IntN(128), "stream": stream, "n": n}
	path := "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
		body["messages"] = []map[string]string{{"role": "user", "content": prompt.String()}}
	} else {
		body["prompt"] = prompt.String()
	}
	if stream && rng.IntN(2) == 0 {
		body["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(body)
	key := []string{"key-alpha", "key-beta"}[rng.IntN(2)]
	if rng.IntN(100) == 0 {
		key = "key-wrong"
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cancels := rng.Float64() < s.o.cancelRate
	if cancels {
		t := time.AfterFunc(time.Duration(rng.IntN(30_000))*time.Microsecond, cancel)
		defer t.Stop()
	}
	req, _ := http.NewRequestWithContext(rctx, "POST", s.gwURL+path, strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	// An error is our own hang-up when this request's context ended and
	// the run's did not; anything else is a transport error.
	failed := func() {
		if rctx.Err() != nil && ctx.Err() == nil {
			s.canceled.Add(1)
		} else {
			s.netErrs.Add(1)
		}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		failed()
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		failed()
		return
	}
	c, _ := s.codes.LoadOrStore(resp.StatusCode, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
	if resp.StatusCode == 200 && stream && !strings.HasSuffix(string(data), "data: [DONE]\n\n") {
		s.broken.Add(1)
	}
}

func (s *soak) metrics() (benchkit.Metrics, error) {
	return benchkit.Scrape(context.Background(), s.client, s.gwURL+"/metrics")
}

// atRest is the gateway once its clients are idle.
type atRest struct {
	goroutines, rss, inflight float64
	held, queued, bound       int64
	metrics                   benchkit.Metrics
}

// rest waits for the gateway to be idle — nothing in flight, idle client
// connections closed — and reads its state.
func (s *soak) rest(ctx context.Context) (atRest, error) {
	s.client.CloseIdleConnections()
	var r atRest
	deadline := time.Now().Add(20 * time.Second)
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		m, err := s.metrics()
		s.client.CloseIdleConnections()
		if err != nil {
			last = err
			time.Sleep(200 * time.Millisecond)
			continue
		}
		st, err := s.status()
		if err != nil {
			last = err
			time.Sleep(200 * time.Millisecond)
			continue
		}
		r = atRest{goroutines: m["go_goroutines"], rss: m["process_resident_memory_bytes"], inflight: m["kvgate_requests_in_flight"], metrics: m}
		for _, g := range st.GPUs {
			r.held += g.Held + g.Committed
			r.bound += int64(g.Bound)
		}
		for _, q := range st.Queues {
			r.queued += int64(q.Queued)
		}
		if r.inflight == 0 && r.held == 0 && r.queued == 0 && r.bound == 0 {
			return r, nil
		}
		last = fmt.Errorf("in flight %g, held %d, queued %d, bound %d", r.inflight, r.held, r.queued, r.bound)
		time.Sleep(200 * time.Millisecond)
	}
	return r, fmt.Errorf("the gateway did not come to rest within 20s: %v", last)
}

type statusView struct {
	GPUs []struct {
		GPU       string `json:"gpu"`
		Held      int64  `json:"held_bytes"`
		Committed int64  `json:"committed_bytes"`
		Bound     int    `json:"bound_requests"`
	} `json:"gpus"`
	Queues []struct {
		Model  string `json:"model"`
		Queued int    `json:"queued"`
	} `json:"queues"`
}

func (s *soak) status() (statusView, error) {
	var v statusView
	resp, err := s.client.Get(s.gwURL + "/status")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// settledGoroutines waits for the gateway's goroutines to settle once its
// clients are gone — fasthttp ends idle workers 10 s after their last
// request — and returns the count: the same every time the gateway is at
// rest, unless something leaks.
func (s *soak) settledGoroutines() float64 {
	var g, low float64 = 0, -1
	var lowAt time.Time
	for deadline := time.Now().Add(40 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		s.client.CloseIdleConnections()
		m, err := s.metrics()
		if err != nil {
			continue
		}
		g = m["go_goroutines"]
		if low < 0 || g < low {
			low, lowAt = g, time.Now()
		}
		if time.Since(lowAt) > 12*time.Second {
			break
		}
	}
	return low
}

func (s *soak) report(base, end atRest, series []sample, reloadsOK, reloadsBad int, elapsed time.Duration) error {
	m := end.metrics
	end.goroutines = s.settledGoroutines()
	if final, err := s.metrics(); err == nil {
		end.rss = final["process_resident_memory_bytes"]
	}
	statuses := map[int]int64{}
	var codes []int
	s.codes.Range(func(k, v any) bool {
		statuses[k.(int)] = v.(*atomic.Int64).Load()
		codes = append(codes, k.(int))
		return true
	})
	sort.Ints(codes)

	// Memory is flat when the end of the run is no higher than its first
	// tenth after warm-up, give or take the collector's swing.
	rssRef := base.rss
	if len(series) > 0 {
		rssRef = series[0].rss
	}
	rssFlat := end.rss <= rssRef*1.25+32<<20
	internal := m.Sum("kvgate_requests_total", `reason="internal"`)
	s.check("gateway alive", s.gw.alive(), "pid %d", s.gw.cmd.Process.Pid)
	s.check("nothing held", end.held == 0 && end.bound == 0, "%d bytes held or committed, %d requests bound", end.held, end.bound)
	s.check("queues empty", end.queued == 0, "%d queued", end.queued)
	s.check("nothing in flight", end.inflight == 0, "%g", end.inflight)
	s.check("goroutines back to baseline", end.goroutines <= base.goroutines+4, "%d at the end, %d at baseline", int(end.goroutines), int(base.goroutines))
	s.check("RSS flat", rssFlat, "%s at the end, %s after the first tenth, %s at baseline", mib(end.rss), mib(rssRef), mib(base.rss))
	s.check("good reloads applied", m.Sum("kvgate_config_reloads_total", `result="ok"`) == float64(reloadsOK), "%g of %d", m.Sum("kvgate_config_reloads_total", `result="ok"`), reloadsOK)
	s.check("broken reload refused and counted", m.Sum("kvgate_config_reloads_total", `result="error"`) == float64(reloadsBad), "%g of %d", m.Sum("kvgate_config_reloads_total", `result="error"`), reloadsBad)
	s.check("no internal errors", internal == 0, "%g", internal)
	s.check("no broken 200 streams", s.broken.Load() == 0, "%d streams ended without [DONE] or an error event", s.broken.Load())
	s.check("no transport errors but our own hang-ups", s.netErrs.Load() == 0, "%d", s.netErrs.Load())

	fmt.Printf("\nkvgate soak: %d requests, %d clients, sims at --time-scale %g, %s on %d CPUs (%s/%s)\n",
		s.sent.Load(), s.o.concurrency, s.o.timeScale, elapsed.Round(time.Second), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	fmt.Printf("  %.0f requests/s while sending (%s of the run)\n", float64(s.sent.Load())/s.loadTime.Seconds(), s.loadTime.Round(time.Second))
	fmt.Printf("  client saw:")
	for _, c := range codes {
		fmt.Printf(" %d×%d", statuses[c], c)
	}
	fmt.Printf(", %d hung up on purpose\n", s.canceled.Load())
	fmt.Printf("  gateway counted: ok %g, shed %g, rejected %g, failed %g, canceled %g\n",
		m.Sum("kvgate_requests_total", `outcome="ok"`), m.Sum("kvgate_requests_total", `outcome="shed"`), m.Sum("kvgate_requests_total", `outcome="rejected"`),
		m.Sum("kvgate_requests_total", `outcome="failed"`), m.Sum("kvgate_requests_total", `outcome="canceled"`))
	fmt.Printf("  faults: sim1 killed at 25%%, restarted at 40%%; %d reloads, 1 broken\n", reloadsOK+reloadsBad)
	fmt.Printf("  RSS: baseline %s", mib(base.rss))
	for _, x := range series {
		fmt.Printf(", %d: %s", x.at, mib(x.rss))
	}
	fmt.Printf(", end %s\n", mib(end.rss))
	fmt.Printf("  goroutines: baseline %d, end %d\n\n", int(base.goroutines), int(end.goroutines))
	failed := 0
	for _, c := range s.checks {
		mark := "ok  "
		if !c.ok {
			mark, failed = "FAIL", failed+1
		}
		fmt.Printf("  %s %-42s %s\n", mark, c.name, c.info)
	}
	if failed > 0 {
		return errors.New(strconv.Itoa(failed) + " checks failed; logs in " + s.dir)
	}
	os.RemoveAll(s.dir)
	return nil
}
