// Command fleet-redis is the shared budget's end-to-end benchmark: a real
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
//  2. one replica killed with SIGKILL while it holds leases: how long until
//     the other two hold its capacity and admit into it;
//  3. redis-server stopped: the replicas serve on static shares; started
//     again: their leases resume;
//  4. light load, alternating between a shared replica and the in-process
//     gateway: the p50 latency the shared budget adds (last, so that its
//     short answers, all cut by max_tokens, are a small part of what the
//     predictors learned).
//
// The simulator's out-of-memory counter is read around every phase. It
// prints one table and a verdict per acceptance bar, and exits 1 if a bar
// is missed or a component is missing. bench/fleet-redis/run.sh builds
// kvgate and runs it.
package main

import (
	"bufio"
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
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
	flag.BoolVar(&o.trace, "trace", false, "print each replica's lease and commitments every 2 s while the fleet saturates")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "fleet-redis:", err)
		os.Exit(1)
	}
}

func run(o options) (err error) {
	if o.kvgate == "" {
		return errors.New("-kvgate is required (bench/fleet-redis/run.sh builds it)")
	}
	for _, bin := range []*string{&o.kvgate, &o.redisServer} {
		p, err := exec.LookPath(*bin)
		if err != nil {
			return fmt.Errorf("%s is required and was not found (apt-get install redis-server): %w", *bin, err)
		}
		*bin = p
	}
	dir, err := os.MkdirTemp("", "fleet-redis-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("working directory:", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	b := &bench{o: o, dir: dir}
	defer b.stopAll()
	if err := b.start(); err != nil {
		return err
	}
	return b.phases()
}

// proc is a process the bench started.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

type bench struct {
	o   options
	dir string

	mu    sync.Mutex
	procs []*proc

	redisPort    int
	redis        *proc
	simURL       string
	replicas     []string // shared-budget replicas' URLs
	replicaProcs []*proc
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

func (b *bench) spawn(name string, args ...string) (*proc, error) {
	logf, err := os.Create(filepath.Join(b.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	b.mu.Lock()
	b.procs = append(b.procs, p)
	b.mu.Unlock()
	return p, nil
}

// stop ends p with SIGTERM (or SIGKILL after 10 s) and waits for it.
func (p *proc) stop(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (b *bench) stopAll() {
	b.mu.Lock()
	procs := slices.Clone(b.procs)
	b.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop(syscall.SIGTERM)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitReady polls url until it answers 200, or p exits, or a minute passes.
func (b *bench) waitReady(p *proc, url string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			log, _ := os.ReadFile(filepath.Join(b.dir, p.name+".log"))
			return fmt.Errorf("%s exited while starting; its log:\n%s", p.name, log)
		default:
		}
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready at %s after a minute", p.name, url)
}

func (b *bench) startRedis() error {
	p, err := b.spawn("redis", b.o.redisServer, "--port", strconv.Itoa(b.redisPort), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", b.dir)
	if err != nil {
		return err
	}
	b.redis = p
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(b.redisPort))); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.done:
			return errors.New("redis-server exited at start (see its log with -keep)")
		case <-time.After(20 * time.Millisecond):
		}
	}
	return errors.New("redis-server did not listen within 30s")
}

const modelYAML = `models:
  - name: llama-3-8b
    geometry: {layers: 32, kv_heads: 8, head_dim: 128, dtype: bfloat16}
    weights_bytes: 16060522496
    max_model_len: 8192
    tokenizer: backend
`

func (b *bench) gatewayConfig(port int, shared string) string {
	return fmt.Sprintf("listen: 127.0.0.1:%d\nadmission: {reservation: %s}\n%sbackends:\n  - {name: gpu0, url: %q, models: [llama-3-8b], gpu_memory: 24GiB}\n%s",
		port, b.o.reservation, modelYAML, b.simURL, shared)
}

func (b *bench) startGateway(name, cfg string) (*proc, string, error) {
	path := filepath.Join(b.dir, name+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, "", err
	}
	p, err := b.spawn(name, b.o.kvgate, "serve", "--config", path)
	if err != nil {
		return nil, "", err
	}
	var port int
	for _, line := range strings.Split(cfg, "\n") {
		if v, ok := strings.CutPrefix(line, "listen: 127.0.0.1:"); ok {
			port, _ = strconv.Atoi(v)
		}
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	return p, url, b.waitReady(p, url+"/readyz")
}

func (b *bench) start() error {
	var err error
	if b.redisPort, err = freePort(); err != nil {
		return err
	}
	if err := b.startRedis(); err != nil {
		return err
	}
	out, _ := exec.Command(b.o.redisServer, "--version").Output()
	b.redisVersion = strings.TrimSpace(string(out))
	simPort, err := freePort()
	if err != nil {
		return err
	}
	sim, err := b.spawn("sim", b.o.kvgate, "sim", "--listen", fmt.Sprintf("127.0.0.1:%d", simPort), "--on-overflow", "oom",
		"--gpu-memory-utilization", "0.75", "--time-scale", strconv.FormatFloat(b.o.timeScale, 'g', -1, 64),
		"--output-len", b.o.outputLen, "--seed", "1")
	if err != nil {
		return err
	}
	b.simURL = fmt.Sprintf("http://127.0.0.1:%d", simPort)
	if err := b.waitReady(sim, b.simURL+"/health"); err != nil {
		return err
	}
	redisURL := fmt.Sprintf("redis://127.0.0.1:%d/0", b.redisPort)
	for i := range 3 {
		port, err := freePort()
		if err != nil {
			return err
		}
		name := fmt.Sprintf("r%d", i+1)
		p, url, err := b.startGateway(name, b.gatewayConfig(port, fmt.Sprintf("shared_budget: {redis: %q, replicas: 3, replica: %s}\n", redisURL, name)))
		if err != nil {
			return err
		}
		b.replicas = append(b.replicas, url)
		b.replicaProcs = append(b.replicaProcs, p)
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	if _, b.single, err = b.startGateway("in-process", b.gatewayConfig(port, "")); err != nil {
		return err
	}
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

// gpuStatus is what the bench reads of a gateway's /status.
type gpuStatus struct {
	budget, committed, limit int64
	leased                   int64
	fallback                 bool
	fleet                    map[string]int64
}

func (b *bench) status(url string) (gpuStatus, error) {
	resp, err := http.Get(url + "/status")
	if err != nil {
		return gpuStatus{}, err
	}
	defer resp.Body.Close()
	var v struct {
		GPUs []struct {
			Capacity  int64  `json:"capacity_bytes"`
			Committed int64  `json:"committed_bytes"`
			Limit     *int64 `json:"limit_bytes"`
		} `json:"gpus"`
		SharedBudget *struct {
			GPUs []struct {
				Leased   int64 `json:"leased_bytes"`
				Fallback bool  `json:"fallback"`
				Fleet    []struct {
					Replica string `json:"replica"`
					Bytes   int64  `json:"leased_bytes"`
				} `json:"fleet"`
			} `json:"gpus"`
		} `json:"shared_budget"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return gpuStatus{}, fmt.Errorf("%s/status: %w", url, err)
	}
	if len(v.GPUs) != 1 {
		return gpuStatus{}, fmt.Errorf("%s/status: %d GPUs", url, len(v.GPUs))
	}
	s := gpuStatus{budget: v.GPUs[0].Capacity, committed: v.GPUs[0].Committed, limit: -1, fleet: map[string]int64{}}
	if v.GPUs[0].Limit != nil {
		s.limit = *v.GPUs[0].Limit
	}
	if sb := v.SharedBudget; sb != nil && len(sb.GPUs) == 1 {
		s.leased, s.fallback = sb.GPUs[0].Leased, sb.GPUs[0].Fallback
		for _, h := range sb.GPUs[0].Fleet {
			s.fleet[h.Replica] = h.Bytes
		}
	}
	return s, nil
}

func scrape(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == labels[i] && l.GetValue() == labels[i+1] }) {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func (b *bench) simGauge(name string) (float64, error) {
	fams, err := scrape(b.simURL)
	if err != nil {
		return 0, err
	}
	v, ok := value(fams, name)
	if !ok {
		return 0, fmt.Errorf("the simulator exports no %s", name)
	}
	return v, nil
}

// kvSampler reads the simulator's KV usage every 200 ms.
type kvSampler struct {
	mu      sync.Mutex
	samples []float64
	stop    chan struct{}
	done    chan struct{}
}

func (b *bench) sampleKV() *kvSampler {
	s := &kvSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			if v, err := b.simGauge("vllm:kv_cache_usage_perc"); err == nil {
				s.mu.Lock()
				s.samples = append(s.samples, v)
				s.mu.Unlock()
			}
		}
	}()
	return s
}

func (s *kvSampler) end() (mean, peak float64) {
	close(s.stop)
	<-s.done
	for _, v := range s.samples {
		mean += v
		peak = max(peak, v)
	}
	if len(s.samples) > 0 {
		mean /= float64(len(s.samples))
	}
	return mean, peak
}

// load is a closed loop of clients sending to targets round robin,
// skipping a target that refuses connections (a load balancer's health
// check, in one line).
type load struct {
	targets []string
	dead    []atomic.Bool
	stopped atomic.Bool
	wg      sync.WaitGroup
	ok      []atomic.Int64 // per target
	shed    atomic.Int64
	failed  atomic.Int64
	oom     atomic.Int64
	cancel  context.CancelFunc
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0}}

func (b *bench) startLoad(targets []string, clients int) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{targets: targets, dead: make([]atomic.Bool, len(targets)), ok: make([]atomic.Int64, len(targets)), cancel: cancel}
	for c := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for n := c; !l.stopped.Load(); n++ {
				i := n % len(targets)
				for l.dead[i].Load() {
					n++
					i = n % len(targets)
				}
				body := chatBody(rng, b.o.promptTokens, b.o.maxTokens)
				status, text, retry, err := post(ctx, targets[i], body)
				switch {
				case l.stopped.Load():
					return
				case err != nil:
					var op *net.OpError
					if errors.As(err, &op) && op.Op == "dial" {
						l.dead[i].Store(true)
					}
					l.failed.Add(1)
				case strings.Contains(text, "CUDA out of memory"):
					l.oom.Add(1)
				case status == 200:
					l.ok[i].Add(1)
				case status == 429:
					l.shed.Add(1)
					time.Sleep(min(retry, 2*time.Second))
				default:
					l.failed.Add(1)
				}
			}
		}()
	}
	return l
}

func (l *load) halt() {
	l.stopped.Store(true)
	l.cancel()
	l.wg.Wait()
}

func (l *load) served() int64 {
	var n int64
	for i := range l.ok {
		n += l.ok[i].Load()
	}
	return n
}

func (l *load) counts() (ok, shed, failed, oom int64) {
	return l.served(), l.shed.Load(), l.failed.Load(), l.oom.Load()
}

// chatBody is a streamed chat request of about prompt tokens (the
// simulator counts " w123" as two) and max_tokens, its words random so
// that the simulator draws each request's output length afresh.
func chatBody(rng *rand.Rand, prompt, maxTokens int) string {
	var sb strings.Builder
	for range prompt / 2 {
		sb.WriteString(" w")
		sb.WriteString(strconv.Itoa(rng.IntN(1000)))
	}
	b, _ := json.Marshal(map[string]any{
		"model": "llama-3-8b", "max_tokens": maxTokens, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": sb.String()}},
	})
	return string(b)
}

func post(ctx context.Context, url, body string) (status int, text string, retry time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if s, e := strconv.Atoi(resp.Header.Get("Retry-After")); e == nil {
		retry = time.Duration(s) * time.Second
	}
	return resp.StatusCode, string(data), retry, err
}

// latency alternates small requests between two targets from two clients
// and returns each target's latencies (non-streamed, 4 output tokens).
func (b *bench) latency(targets [2]string, n int) ([2][]time.Duration, error) {
	var out [2][]time.Duration
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for c := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 11))
			for k := range n {
				i := (k + c) % 2
				body, _ := json.Marshal(map[string]any{"model": "llama-3-8b", "max_tokens": 4,
					"messages": []map[string]string{{"role": "user", "content": "hello" + strconv.Itoa(rng.IntN(1<<20))}}})
				start := time.Now()
				status, text, _, err := post(context.Background(), targets[i], string(body))
				took := time.Since(start)
				mu.Lock()
				if err == nil && status != 200 {
					err = fmt.Errorf("%s: status %d: %.200s", targets[i], status, text)
				}
				if err != nil && firstErr == nil {
					firstErr = err
				}
				out[i] = append(out[i], took)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out, firstErr
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

func pct(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

func (b *bench) row(cols ...string) { b.rows = append(b.rows, cols) }

func (b *bench) note(format string, args ...any) {
	b.notes = append(b.notes, fmt.Sprintf(format, args...))
}

func (b *bench) check(ok bool, format string, args ...any) {
	b.verdicts = append(b.verdicts, verdict{ok, fmt.Sprintf(format, args...)})
}

// oomSince is the simulator's out-of-memory events since the start.
func (b *bench) oomSince() int64 {
	v, err := b.simGauge("kvsim_oom_events_total")
	if err != nil {
		return -1
	}
	return int64(v - b.oomBefore)
}

// waitUntil polls cond every 50 ms for up to limit and says how long it
// took (false if it never held).
func waitUntil(limit time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < limit {
		if cond() {
			return time.Since(start), true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return limit, false
}

func (b *bench) leasesOf(urls ...string) (leased, committed int64, fallback int) {
	for _, u := range urls {
		st, err := b.status(u)
		if err != nil {
			continue
		}
		leased += st.leased
		committed += st.committed
		if st.fallback {
			fallback++
		}
	}
	return leased, committed, fallback
}

func (b *bench) phases() error {
	o := b.o
	// 1a. Saturation through the in-process gateway alone.
	mean1 := b.saturate("saturation, one gateway", []string{b.single}, "in-process")
	b.baselineOOM = b.oomSince()
	// 1b. The same load through the three replicas.
	fmt.Fprintf(os.Stderr, "saturation: %d clients across three replicas...\n", o.clients)
	fleetLoad := b.startLoad(b.replicas, o.clients)
	defer fleetLoad.halt()
	time.Sleep(o.warmup)
	kv := b.sampleKV()
	okBefore := make([]int64, 3)
	for i := range okBefore {
		okBefore[i] = fleetLoad.ok[i].Load()
	}
	_, shedB, failB, _ := fleetLoad.counts()
	oomB := b.oomSince()
	if o.trace {
		for range int(o.measure / (2 * time.Second)) {
			time.Sleep(2 * time.Second)
			var parts []string
			for i, u := range b.replicas {
				st, err := b.status(u)
				if err == nil {
					parts = append(parts, fmt.Sprintf("r%d leased %4d limit %4d committed %4d", i+1, st.leased/b.blockBytes, st.limit/b.blockBytes, st.committed/b.blockBytes))
				}
			}
			used, _ := b.simGauge("kvsim_kv_cache_used_blocks")
			fmt.Fprintf(os.Stderr, "  blocks: %s | sim used %4.0f\n", strings.Join(parts, " | "), used)
		}
	} else {
		time.Sleep(o.measure)
	}
	mean3, peak3 := kv.end()
	okA, shedA, failA, _ := fleetLoad.counts()
	oomA := b.oomSince()
	var per []string
	for i := range okBefore {
		per = append(per, strconv.FormatInt(fleetLoad.ok[i].Load()-okBefore[i], 10))
	}
	ok3 := okA - (okBefore[0] + okBefore[1] + okBefore[2])
	b.row("saturation, three replicas", "r1+r2+r3", strconv.FormatInt(ok3, 10), strconv.FormatInt(shedA-shedB, 10),
		strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oomA-oomB, 10), pct(mean3), pct(peak3),
		fmt.Sprintf("%.1f req/s; served per replica %s", float64(ok3)/o.measure.Seconds(), strings.Join(per, "/")))
	b.check(mean1-mean3 <= 0.10, "real KV use at saturation: three replicas %s vs one gateway %s (within 10 points: %+.1f)", pct(mean3), pct(mean1), 100*(mean3-mean1))

	// 2. SIGKILL one replica while it holds leases.
	st3, _ := b.status(b.replicas[2])
	lease12, _, _ := b.leasesOf(b.replicas[0], b.replicas[1])
	okB, shedB, failB, _ := fleetLoad.counts()
	oomB = b.oomSince()
	fmt.Fprintf(os.Stderr, "SIGKILL r3 (holding %d bytes)...\n", st3.leased)
	b.replicaProcs[2].stop(syscall.SIGKILL)
	// Until r1 and r2 lease 90% of r3's part, and commit more than they
	// leased before the kill (by a chunk).
	var tookLease, tookAdmit time.Duration
	gotLease, gotAdmit := false, false
	killed := time.Now()
	for time.Since(killed) < 30*time.Second && !(gotLease && gotAdmit) {
		l, c, _ := b.leasesOf(b.replicas[0], b.replicas[1])
		if !gotLease && l >= lease12+st3.leased*9/10 {
			gotLease, tookLease = true, time.Since(killed)
		}
		if !gotAdmit && c > lease12+st3.budget/50 { // a chunk past what they leased before

			gotAdmit, tookAdmit = true, time.Since(killed)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(5 * time.Second)
	okA, shedA, failA, _ = fleetLoad.counts()
	oomA = b.oomSince()
	note := fmt.Sprintf("r3 held %.0f MiB: r1+r2 leased 90%% of it after %.1f s, bound past their old leases after %.1f s",
		float64(st3.leased)/(1<<20), tookLease.Seconds(), tookAdmit.Seconds())
	b.row("SIGKILL r3 mid-run", "r1+r2", strconv.FormatInt(okA-okB, 10), strconv.FormatInt(shedA-shedB, 10), strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oomA-oomB, 10), "", "", note)
	b.check(st3.leased > 0 && gotLease && gotAdmit && tookLease <= 5*time.Second && tookAdmit <= 5*time.Second,
		"killed replica's capacity taken by the others: leased after %.1f s, admitted into after %.1f s (≤ 5 s)", tookLease.Seconds(), tookAdmit.Seconds())

	// 3. Redis stopped, then started again.
	okB, shedB, failB, _ = fleetLoad.counts()
	oomB = b.oomSince()
	fmt.Fprintln(os.Stderr, "stopping redis-server...")
	b.redis.stop(syscall.SIGTERM)
	tookFallback, fellBack := waitUntil(30*time.Second, func() bool {
		_, _, fb := b.leasesOf(b.replicas[0], b.replicas[1])
		return fb == 2
	})
	kv = b.sampleKV()
	time.Sleep(15 * time.Second)
	meanOut, peakOut := kv.end()
	var limits []string
	for _, u := range b.replicas[:2] {
		if st, err := b.status(u); err == nil {
			limits = append(limits, fmt.Sprintf("%.0f", float64(st.limit)/(1<<20)))
		}
	}
	okA, shedA, failA, _ = fleetLoad.counts()
	oomA = b.oomSince()
	b.row("Redis stopped", "r1+r2", strconv.FormatInt(okA-okB, 10), strconv.FormatInt(shedA-shedB, 10), strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oomA-oomB, 10),
		pct(meanOut), pct(peakOut), fmt.Sprintf("fallback after %.1f s; limits %s MiB (share %.0f MiB)", tookFallback.Seconds(), strings.Join(limits, "/"), float64(st3.budget/3)/(1<<20)))
	b.check(fellBack && okA > okB && oomA == oomB, "Redis stopped: both replicas on static shares after %.1f s, %d served, 0 overflow", tookFallback.Seconds(), okA-okB)

	okB, shedB, failB, _ = fleetLoad.counts()
	oomB = b.oomSince()
	fmt.Fprintln(os.Stderr, "starting redis-server again...")
	if err := b.startRedis(); err != nil {
		return err
	}
	tookBack, back := waitUntil(30*time.Second, func() bool {
		for _, u := range b.replicas[:2] {
			st, err := b.status(u)
			if err != nil || st.fallback || st.leased == 0 || len(st.fleet) < 2 {
				return false
			}
		}
		return true
	})
	time.Sleep(5 * time.Second)
	okA, shedA, failA, _ = fleetLoad.counts()
	oomA = b.oomSince()
	l12, _, _ := b.leasesOf(b.replicas[0], b.replicas[1])
	b.row("Redis restarted", "r1+r2", strconv.FormatInt(okA-okB, 10), strconv.FormatInt(shedA-shedB, 10), strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oomA-oomB, 10),
		"", "", fmt.Sprintf("leases resumed after %.1f s; r1+r2 lease %.0f MiB", tookBack.Seconds(), float64(l12)/(1<<20)))
	b.check(back, "Redis restarted: leases resumed after %.1f s", tookBack.Seconds())
	fleetLoad.halt()

	// 4. Light load: the latency a shared replica adds. Last, so that its
	// short answers (all cut by max_tokens) are a small part of what the
	// predictors learned.
	fmt.Fprintf(os.Stderr, "light load: %d requests to each of a shared replica and the in-process gateway...\n", o.latencyRequests)
	oomB = b.oomSince()
	if lat, err := b.latency([2]string{b.replicas[0], b.single}, o.latencyRequests); err != nil {
		// The table so far still says where an overflow happened.
		b.row("light load (2 clients)", "both", "", "", "", strconv.FormatInt(b.oomSince()-oomB, 10), "", "", "stopped: "+err.Error())
		b.check(false, "light load: %v", err)
	} else {
		shared, inproc := p50(lat[0]), p50(lat[1])
		added := shared - inproc
		b.row("light load (2 clients)", "in-process", strconv.Itoa(len(lat[1])), "", "", "", "", "", "p50 "+ms(inproc))
		b.row("light load (2 clients)", "shared r1", strconv.Itoa(len(lat[0])), "", "", "", "", "", fmt.Sprintf("p50 %s (%+.2f ms)", ms(shared), float64(added)/float64(time.Millisecond)))
		b.check(added <= time.Millisecond, "p50 latency added by the shared budget %+.2f ms (≤ 1 ms)", float64(added)/float64(time.Millisecond))
	}

	oom := b.oomSince() - b.baselineOOM
	b.check(oom == 0, "zero overflow behind the replicas: %d out-of-memory events in the simulator from the fleet's first request to the end", oom)
	if b.baselineOOM > 0 {
		b.note("the in-process gateway alone overflowed the simulator %d times on the same load: a limit of its %s policy, not of the shared budget", b.baselineOOM, o.reservation)
	}
	b.print()
	for _, v := range b.verdicts {
		if !v.ok {
			return errors.New("a bar was missed")
		}
	}
	return nil
}

// saturate runs the saturating load through targets and returns the mean
// KV use over the measured window.
func (b *bench) saturate(phase string, targets []string, label string) float64 {
	fmt.Fprintf(os.Stderr, "saturation: %d clients through %s...\n", b.o.clients, label)
	l := b.startLoad(targets, b.o.clients)
	time.Sleep(b.o.warmup)
	kv := b.sampleKV()
	okB, shedB, failB, _ := l.counts()
	oomB := b.oomSince()
	time.Sleep(b.o.measure)
	mean, peak := kv.end()
	okA, shedA, failA, _ := l.counts()
	oomA := b.oomSince()
	l.halt()
	ok := okA - okB
	b.row(phase, label, strconv.FormatInt(ok, 10), strconv.FormatInt(shedA-shedB, 10), strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oomA-oomB, 10),
		pct(mean), pct(peak), fmt.Sprintf("%.1f req/s", float64(ok)/b.o.measure.Seconds()))
	// Let what is in flight finish before the next phase.
	time.Sleep(2 * time.Second)
	return mean
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return runtime.GOARCH
}

func (b *bench) print() {
	o := b.o
	fmt.Printf("fleet-redis: three kvgate replicas sharing one simulated GPU through Redis, against one gateway with the in-process budget\n")
	fmt.Printf("machine: %s, %d CPUs, %s/%s, %s; %s\n", cpuModel(), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), b.redisVersion)
	fmt.Printf("GPU: simulated Llama-3-8B on 24 GiB, pool at the 0.75 ceiling = budget %d blocks (%.0f MiB), --on-overflow oom, time scale %g\n",
		b.budgetBlocks, float64(b.budgetBlocks*b.blockBytes)/(1<<20), o.timeScale)
	fmt.Printf("load: %d closed-loop clients, ~%d-token prompts, max_tokens %d, outputs %s; warm-up %v, measured %v; reservation %s; lease_ttl 3s, chunk 2%%\n\n",
		o.clients, o.promptTokens, o.maxTokens, o.outputLen, o.warmup, o.measure, o.reservation)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "phase\ttarget\tok\t429\tfailed\toom\tKV mean\tKV peak\tnotes")
	for _, r := range b.rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
	fmt.Println()
	for _, v := range b.verdicts {
		mark := "PASS"
		if !v.ok {
			mark = "FAIL"
		}
		fmt.Printf("%s  %s\n", mark, v.text)
	}
	for _, n := range b.notes {
		fmt.Printf("NOTE  %s\n", n)
	}
}
