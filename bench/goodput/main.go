// Command goodput measures what kvgate's admission policies get out of one
// simulated GPU, side by side with what users would otherwise run, in one
// run: the simulator straight at a sweep of concurrency limits (the best one
// that never overflowed is what a fixed limit gives), the gateway with that
// limit (admission.mode count), with worst-case reservations, and with
// predicted ones (the default), vLLM's own preempt mode driven directly, and
// the same simulator with a pool too large to fill (what no scheduler can
// beat). It prints one table per workload: goodput (output tokens per second
// of answered requests), real KV use over the saturated part of the run and
// at its peak, overflow events, preemptions, sheds and failures; then the
// issue's acceptance checks against it.
//
//	go run ./bench/goodput [--requests 1500] [--clients 128] [--time-scale 0.25]
//
// It builds kvgate, starts every simulator and gateway as a process of its
// own on free loopback ports, and drives them with kvgate loadtest.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The simulated GPU: Llama-3-8B on 24 GiB, its pool at vLLM's default
// utilization 0.9 (2888 blocks of 16 tokens, 46k tokens), the gateway's
// ceiling at the same 0.9 so that its budget is the whole pool.
const (
	model       = "llama-3-8b"
	utilization = "0.9"
)

type options struct {
	requests  int
	clients   int
	timeScale float64
	sweep     string
	out       string
	kvgate    string
	workloads string
	seed      uint64
}

func main() {
	var o options
	flag.IntVar(&o.requests, "requests", 1500, "requests per measured step")
	flag.IntVar(&o.clients, "clients", 128, "concurrent clients of the saturated steps (at least 4× what the pool holds at worst case)")
	flag.Float64Var(&o.timeScale, "time-scale", 0.25, "simulator wall time per simulated time (0.25: four times faster than a real GPU)")
	flag.StringVar(&o.sweep, "sweep", "8..32+4", "concurrency limits tried straight at the simulator")
	flag.StringVar(&o.out, "out", "", "directory for the load tester's JSON reports and the logs (default: a temporary one)")
	flag.StringVar(&o.kvgate, "kvgate", "", "kvgate binary (default: go build ./cmd/kvgate)")
	flag.StringVar(&o.workloads, "workloads", "early-stop,fixed", "workloads to run: early-stop (lognormal outputs stopping early), fixed (outputs of 128 or 512)")
	flag.Uint64Var(&o.seed, "seed", 7, "seed of the prompt and output lengths")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "goodput:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if o.out == "" {
		dir, err := os.MkdirTemp("", "kvgate-goodput-")
		if err != nil {
			return err
		}
		o.out = dir
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if o.kvgate == "" {
		o.kvgate = filepath.Join(o.out, "kvgate")
		fmt.Fprintf(os.Stderr, "building kvgate into %s\n", o.kvgate)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", o.kvgate, "./cmd/kvgate")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build ./cmd/kvgate (run from the repository root): %w", err)
		}
	}
	fmt.Printf("kvgate goodput benchmark: %s, %d CPUs, %s; %d requests a step, %d clients, simulator time scale %g\n",
		runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02 15:04 MST"), o.requests, o.clients, o.timeScale)
	fmt.Printf("reports and logs: %s\n\n", o.out)
	for _, w := range strings.Split(o.workloads, ",") {
		wl, err := workloadNamed(w, o)
		if err != nil {
			return err
		}
		rows, err := wl.run(ctx, o)
		if err != nil {
			return err
		}
		printTable(os.Stdout, wl, rows)
		if wl.name == "early-stop" {
			printChecks(os.Stdout, rows)
		}
		fmt.Println()
	}
	return nil
}

// workload is one traffic shape: prompt lengths (90 % about 256 tokens,
// 10 % about 4000) and how outputs end.
type workload struct {
	name, title string
	simArgs     []string // output lengths the simulator draws
	outputs     string   // the load tester's --output-tokens
	strict      bool     // --strict-openai: let the simulator stop outputs early
	prompts     string   // file of prompt lengths
}

func workloadNamed(name string, o options) (*workload, error) {
	prompts := filepath.Join(o.out, "prompts.txt")
	r := rand.New(rand.NewPCG(o.seed, 1))
	var b strings.Builder
	for range 4096 {
		if r.IntN(10) == 0 {
			fmt.Fprintln(&b, 3800+r.IntN(401))
		} else {
			fmt.Fprintln(&b, 224+r.IntN(65))
		}
	}
	if err := os.WriteFile(prompts, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	switch name {
	case "early-stop":
		return &workload{name: name, title: "outputs that stop early (lognormal median 200, σ 0.8, max_tokens 1024)",
			simArgs: []string{"--output-len", "lognormal:200,0.8"}, outputs: "fixed:1024", strict: true, prompts: prompts}, nil
	case "fixed":
		outs := filepath.Join(o.out, "outputs-fixed.txt")
		var ob strings.Builder
		for i := range 4096 {
			fmt.Fprintln(&ob, []int{128, 512}[(i*7+int(o.seed))%2])
		}
		if err := os.WriteFile(outs, []byte(ob.String()), 0o644); err != nil {
			return nil, err
		}
		return &workload{name: name, title: "outputs of fixed length (128 or 512 tokens, max_tokens = the length)",
			outputs: "file:" + outs, prompts: prompts}, nil
	}
	return nil, fmt.Errorf("unknown workload %q (want early-stop or fixed)", name)
}

// row is one configuration's figures.
type row struct {
	name, note   string
	level        int
	goodput      float64 // output tokens/s of answered requests
	kvMean       float64 // real KV use over the saturated part (share of the pool)
	kvPeak       float64
	overflow     float64 // the simulator's out-of-memory events
	preemptions  float64
	preemptedPct float64 // preemptions per answered request
	ok, shed     int
	failed       int
	window       float64
}

func (w *workload) run(ctx context.Context, o options) ([]row, error) {
	var rows []row
	// (a) Straight at an oom simulator, a sweep of concurrency limits: the
	// best level that never overflowed is what a fixed limit gives.
	sweep, err := w.direct(ctx, o, "direct-sweep", "oom", o.sweep, nil)
	if err != nil {
		return nil, err
	}
	// The best safe limit is the highest level below the first that
	// overflowed: a higher one that got through its run was lucky.
	best := row{}
	for _, r := range sweep {
		if r.overflow > 0 || r.failed > 0 {
			break
		}
		best = r
	}
	if best.level == 0 {
		return nil, fmt.Errorf("%s: every level of the sweep %s overflowed; try lower levels", w.name, o.sweep)
	}
	best.name, best.note = "direct, best safe limit", fmt.Sprintf("limit %d (of %s)", best.level, o.sweep)
	rows = append(rows, best)
	for _, r := range sweep {
		if r.level > best.level {
			r.name, r.note = "direct, next limit", "overflowed"
			rows = append(rows, r)
			break
		}
	}
	conc := strconv.Itoa(o.clients)
	gw := []struct {
		name, note, extra, overflow string
	}{
		{"gateway count", fmt.Sprintf("max_concurrency %d", best.level), fmt.Sprintf("  mode: count\n  max_concurrency: %d\n", best.level), "oom"},
		{"gateway worst_case", "", "  reservation: worst_case\n", "oom"},
		{"gateway predicted", "default config", "", "oom"},
		{"gateway predicted", "preempt simulator", "", "preempt"},
	}
	for _, g := range gw {
		rs, err := w.gateway(ctx, o, g.name+" "+g.overflow, g.overflow, conc, g.extra)
		if err != nil {
			return nil, err
		}
		r := rs[0]
		r.name, r.note = g.name, g.note
		rows = append(rows, r)
	}
	pre, err := w.direct(ctx, o, "direct-preempt", "preempt", conc, nil)
	if err != nil {
		return nil, err
	}
	pre[0].name, pre[0].note = "direct, vLLM preempt", "no gateway"
	rows = append(rows, pre[0])
	unb, err := w.direct(ctx, o, "direct-unbounded", "preempt", conc, []string{"--gpu-memory", "320GiB"})
	if err != nil {
		return nil, err
	}
	unb[0].name, unb[0].note = "unbounded pool", "compute ceiling"
	rows = append(rows, unb[0])
	return rows, nil
}

// direct runs the load straight at a simulator.
func (w *workload) direct(ctx context.Context, o options, name, overflow, levels string, extra []string) ([]row, error) {
	sim, err := startSim(ctx, o, w, name, overflow, extra)
	if err != nil {
		return nil, err
	}
	defer sim.stop()
	return w.load(ctx, o, name, sim.url, sim.url+"/metrics", levels)
}

// gateway runs the load through a gateway in front of a simulator.
func (w *workload) gateway(ctx context.Context, o options, name, overflow, levels, admission string) ([]row, error) {
	sim, err := startSim(ctx, o, w, name, overflow, nil)
	if err != nil {
		return nil, err
	}
	defer sim.stop()
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`listen: 127.0.0.1:%d
server: {request_timeout: 30m}
admission:
  ceiling: %s
  queue: {timeout: 20m}
%smodels:
  - name: %s
    geometry: {layers: 32, kv_heads: 8, head_dim: 128, dtype: bfloat16}
    weights_bytes: 16060522496
    max_model_len: 8192
backends:
  - name: sim0
    url: %s
    models: [%s]
    gpu_memory: 24GiB
`, port, utilization, admission, model, sim.url, model)
	path := filepath.Join(o.out, slug(name)+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	g, err := startProcess(ctx, o, slug(name)+"-gateway", url, "serve", "--config", path)
	if err != nil {
		return nil, err
	}
	defer g.stop()
	return w.load(ctx, o, name, url, sim.url+"/metrics", levels)
}

// load runs kvgate loadtest against url at levels and reads its report.
func (w *workload) load(ctx context.Context, o options, name, url, metrics, levels string) ([]row, error) {
	report := filepath.Join(o.out, slug(w.name+"-"+name)+".json")
	args := []string{"loadtest", "--target", url, "--metrics-url", metrics, "--model", model,
		"--concurrency", levels, "--requests", strconv.Itoa(o.requests), "--keep-going", "--no-saturation-stop",
		"--prompt-tokens", "file:" + w.prompts, "--output-tokens", w.outputs, "--seed", strconv.FormatUint(o.seed, 10),
		"--max-kv-usage", "1", "--max-reruns", "0", "--scrape-interval", "250ms", "--request-timeout", "30m",
		"--progress", "none", "--json", report}
	if w.strict {
		args = append(args, "--strict-openai")
	}
	cmd := exec.CommandContext(ctx, o.kvgate, args...)
	logf, err := os.Create(filepath.Join(o.out, slug(w.name+"-"+name)+"-loadtest.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	fmt.Fprintf(os.Stderr, "%s: %s at %s ...\n", w.name, name, levels)
	// Exit status 1 only says no level was "safe" by the load tester's
	// criteria; the figures are what this benchmark reads.
	if err := cmd.Run(); err != nil && cmd.ProcessState.ExitCode() != 1 {
		return nil, fmt.Errorf("%s: loadtest: %w (see %s)", name, err, logf.Name())
	}
	return readReport(report)
}

// readReport turns the load tester's JSON into rows, one a step.
func readReport(path string) ([]row, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep struct {
		Steps []struct {
			Concurrency      int     `json:"concurrency"`
			WindowS          float64 `json:"window_s"`
			OutputTokensPerS float64 `json:"output_tokens_per_s"`
			Requests         struct {
				OK             int `json:"ok"`
				Shed           int `json:"shed_429"`
				Client4xx      int `json:"client_4xx"`
				Server5xx      int `json:"server_5xx"`
				Overflow       int `json:"overflow"`
				ConnError      int `json:"conn_error"`
				Timeout        int `json:"timeout"`
				WarmupOverflow int `json:"warmup_overflow"`
				WarmupFailed   int `json:"warmup_failed"`
			} `json:"requests"`
			KV *struct {
				PeakUsage   float64      `json:"peak_usage"`
				Preemptions float64      `json:"preemptions"`
				OOMEvents   float64      `json:"oom_events"`
				Curve       []curvePoint `json:"curve"`
			} `json:"kv"`
		} `json:"steps"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var rows []row
	for _, s := range rep.Steps {
		q := s.Requests
		r := row{level: s.Concurrency, goodput: s.OutputTokensPerS, ok: q.OK, shed: q.Shed, window: s.WindowS,
			failed: q.Client4xx + q.Server5xx + q.Overflow + q.ConnError + q.Timeout + q.WarmupOverflow + q.WarmupFailed}
		if kv := s.KV; kv != nil {
			r.kvPeak, r.overflow, r.preemptions = kv.PeakUsage, kv.OOMEvents, kv.Preemptions
			r.kvMean = saturatedMean(kv.Curve)
		}
		if q.OK > 0 {
			r.preemptedPct = 100 * r.preemptions / float64(q.OK)
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: no steps", path)
	}
	return rows, nil
}

// curvePoint is one scrape of the simulator's KV use during a step.
type curvePoint struct {
	T       float64 `json:"t_s"`
	KVUsage float64 `json:"kv_usage"`
}

// saturatedMean is the mean KV use over the middle of the step — from 20 %
// to 80 % of its time, past the ramp-up and before the last requests drain.
func saturatedMean(curve []curvePoint) float64 {
	if len(curve) == 0 {
		return 0
	}
	end := curve[len(curve)-1].T
	var sum float64
	n := 0
	for _, p := range curve {
		if p.T >= 0.2*end && p.T <= 0.8*end {
			sum += p.KVUsage
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

func printTable(w io.Writer, wl *workload, rows []row) {
	fmt.Fprintf(w, "Workload %s: %s; prompts 90%% ≈256, 10%% ≈4000 tokens\n", wl.name, wl.title)
	fmt.Fprintf(w, "%-26s %-20s %6s %10s %7s %8s %7s %8s %8s %6s %6s %6s\n",
		"configuration", "", "conc", "goodput", "×best", "KV mean", "KV peak", "overflow", "preempt", "ok", "429", "failed")
	base := rows[0].goodput
	for _, r := range rows {
		fmt.Fprintf(w, "%-26s %-20s %6d %10.0f %6.2f× %7.1f%% %6.1f%% %8.0f %8.0f %6d %6d %6d\n",
			r.name, r.note, r.level, r.goodput, r.goodput/base, 100*r.kvMean, 100*r.kvPeak, r.overflow, r.preemptions, r.ok, r.shed, r.failed)
	}
	fmt.Fprintln(w, "goodput: output tokens/s of answered requests; KV mean: the simulator's KV use (share of its pool, = the gateway's budget) from 20% to 80% of the step's time; overflow: the simulator's out-of-memory events")
}

// printChecks states the acceptance bars against the early-stop
// table.
func printChecks(w io.Writer, rows []row) {
	find := func(name, note string) *row {
		for i := range rows {
			if rows[i].name == name && (note == "" || rows[i].note == note) {
				return &rows[i]
			}
		}
		return nil
	}
	best, worst := find("direct, best safe limit", ""), find("gateway worst_case", "")
	pred, predPre := find("gateway predicted", "default config"), find("gateway predicted", "preempt simulator")
	pre, unb := find("direct, vLLM preempt", ""), find("unbounded pool", "")
	if best == nil || worst == nil || pred == nil || predPre == nil || pre == nil || unb == nil {
		return
	}
	check := func(ok bool, format string, a ...any) {
		mark := "PASS"
		if !ok {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  [%s] %s\n", mark, fmt.Sprintf(format, a...))
	}
	fmt.Fprintln(w, "Acceptance (issue \"Fill the pool\"), default config, early-stopping workload:")
	check(pred.kvMean >= 0.85, "real KV use %.1f%% of the budget over the saturated part (≥ 85%%)", 100*pred.kvMean)
	check(pred.overflow == 0 && predPre.overflow == 0, "zero overflow on the oom simulator (%.0f)", pred.overflow)
	check(predPre.preemptedPct <= 1, "preemptions on the preempt simulator %.0f, %.2f%% of requests (≤ 1%%)", predPre.preemptions, predPre.preemptedPct)
	check(pred.failed == 0 && pred.shed == 0, "every answer a 200 (%d sheds, %d failures)", pred.shed, pred.failed)
	check(pred.goodput >= 1.3*worst.goodput, "predicted %.2f× worst_case (≥ 1.3×)", pred.goodput/worst.goodput)
	check(pred.goodput >= 1.6*best.goodput, "gateway %.2f× the best safe limit straight at the simulator (≥ 1.6×)", pred.goodput/best.goodput)
	check(pred.goodput >= 0.95*pre.goodput, "gateway %.0f%% of vLLM's preempt mode driven directly (≥ 95%%)", 100*pred.goodput/pre.goodput)
	check(pred.goodput >= 0.8*unb.goodput, "gateway %.0f%% of the unbounded pool (≥ 80%%)", 100*pred.goodput/unb.goodput)
}

type process struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func startSim(ctx context.Context, o options, w *workload, name, overflow string, extra []string) (*process, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	args := []string{"sim", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--on-overflow", overflow,
		"--gpu-memory-utilization", utilization, "--time-scale", strconv.FormatFloat(o.timeScale, 'g', -1, 64),
		"--seed", strconv.FormatUint(o.seed, 10), "--model", model}
	args = append(append(args, w.simArgs...), extra...)
	return startProcess(ctx, o, slug(w.name+"-"+name)+"-sim", url, args...)
}

// startProcess starts kvgate with args and waits until url answers
// /health (the simulator) or /readyz (the gateway).
func startProcess(ctx context.Context, o options, logName, url string, args ...string) (*process, error) {
	logf, err := os.Create(filepath.Join(o.out, logName+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, o.kvgate, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &process{url: url, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	path := "/health"
	if args[0] == "serve" {
		path = "/readyz"
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(url + path)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p, nil
			}
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("kvgate %s exited at start; see %s", strings.Join(args, " "), logf.Name())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("kvgate %s: %s did not answer within a minute", args[0], url+path)
		}
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func slug(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '-'
	}, s)
}
