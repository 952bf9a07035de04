package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

type options struct {
	direct, nginx, kvgate string
	fasthttp              string // "": no floor column
	conns                 []int
	missConns             int
	duration, warmup      time.Duration
	rounds                int
	model                 string
	maxTokens, longTokens int
	notes                 []string
	ready                 time.Duration
	// streamed and prompts select the rows; all of them by default.
	streamed []bool
	prompts  map[string]bool
	// pids are the servers' processes by target (as targetNames), for
	// their CPU time; 0 = not measured.
	pids [len(targetNames)]int
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "floor" {
		return runFloor(args[1:], stderr)
	}
	var o options
	fs := flag.NewFlagSet("overhead", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.direct, "direct", "", "`URL` of the backend itself (required)")
	fs.StringVar(&o.nginx, "nginx", "", "`URL` of nginx in front of it (required)")
	fs.StringVar(&o.kvgate, "kvgate", "", "`URL` of kvgate in front of it (required)")
	fs.StringVar(&o.fasthttp, "fasthttp", "", "`URL` of a bare fasthttp proxy in front of it (overhead floor), for the library's floor; empty: no such column")
	for i, name := range targetNames {
		fs.IntVar(&o.pids[i], name+"-pid", 0, "`pid` of the "+name+" server (its descendants included), to report its CPU time per request; 0 = not measured")
	}
	conns := fs.String("conns", "1,64,256", "connection counts, comma-separated")
	fs.IntVar(&o.missConns, "miss-conns", 64, "connections of the extra rows where every prompt is unique (no prompt cache can answer); 0 = none")
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "measured time per cell, target and round")
	fs.DurationVar(&o.warmup, "warmup", 300*time.Millisecond, "time per cell, target and round before measuring")
	fs.IntVar(&o.rounds, "rounds", 3, "times the whole sweep runs; each target's samples are pooled")
	fs.StringVar(&o.model, "model", "llama-3-8b", "model `name` to request")
	fs.IntVar(&o.maxTokens, "max-tokens", 16, "output tokens per request")
	fs.IntVar(&o.longTokens, "long-tokens", 4096, "prompt tokens of the long prompt (as the backend counts them)")
	streamed := fs.String("streamed", "no,yes", "which rows to run: `no`, yes or no,yes (streamed or not), e.g. to profile one")
	prompts := fs.String("prompts", "short,long", "which prompt `sizes` to run: short, long or both, comma-separated")
	fs.DurationVar(&o.ready, "ready-timeout", 20*time.Second, "how long to wait for every target to answer before measuring")
	freePorts := fs.Int("free-ports", 0, "print `N` free loopback TCP ports, one a line, and exit (for the script that starts the servers)")
	fs.Func("note", "a line for the table's header (repeatable), e.g. the versions under test", func(s string) error {
		o.notes = append(o.notes, s)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *freePorts > 0 {
		return printFreePorts(*freePorts, stdout, stderr)
	}
	if err := o.check(*conns, *streamed, *prompts); err != nil {
		fmt.Fprintf(stderr, "overhead: %v\n", err)
		return 2
	}
	if err := sweep(o, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "overhead: %v\n", err)
		return 1
	}
	return 0
}

func (o *options) check(conns, streamed, prompts string) error {
	for i, pid := range o.pids {
		if pid < 0 {
			return fmt.Errorf("--%s-pid %d: want a process id, or 0 for none", targetNames[i], pid)
		}
	}
	if o.pids[3] != 0 && o.fasthttp == "" {
		return errors.New("--fasthttp-pid without --fasthttp: there is no floor to measure")
	}
	for name, u := range map[string]string{"--direct": o.direct, "--nginx": o.nginx, "--kvgate": o.kvgate} {
		if u == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	for _, f := range strings.Split(conns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("--conns %q: want positive integers, comma-separated", conns)
		}
		o.conns = append(o.conns, n)
	}
	for _, f := range strings.Split(streamed, ",") {
		switch strings.TrimSpace(f) {
		case "no":
			o.streamed = append(o.streamed, false)
		case "yes":
			o.streamed = append(o.streamed, true)
		default:
			return fmt.Errorf("--streamed %q: want no, yes or no,yes", streamed)
		}
	}
	o.prompts = map[string]bool{}
	for _, f := range strings.Split(prompts, ",") {
		f = strings.TrimSpace(f)
		if f != "short" && f != "long" {
			return fmt.Errorf("--prompts %q: want short, long or short,long", prompts)
		}
		o.prompts[f] = true
	}
	switch {
	case o.missConns < 0:
		return fmt.Errorf("--miss-conns must be >= 0, got %d", o.missConns)
	case o.duration <= 0:
		return fmt.Errorf("--duration must be > 0, got %v", o.duration)
	case o.warmup < 0:
		return fmt.Errorf("--warmup must be >= 0, got %v", o.warmup)
	case o.rounds < 1:
		return fmt.Errorf("--rounds must be >= 1, got %d", o.rounds)
	case o.maxTokens < 1:
		return fmt.Errorf("--max-tokens must be >= 1, got %d", o.maxTokens)
	case o.longTokens < 1:
		return fmt.Errorf("--long-tokens must be >= 1, got %d", o.longTokens)
	}
	return nil
}

// targetNames are the targets in the order of cell.result; the last,
// fasthttp, only when --fasthttp is given.
var targetNames = [...]string{"direct", "nginx", "kvgate", "fasthttp"}

// cell is one row of the table.
type cell struct {
	conns  int
	w      workload
	label  string   // prompt column
	result []sample // by target: direct, nginx, kvgate, then fasthttp if measured
}

const shortPrompt = "What is a KV cache? Answer in one line."

// paragraph is ordinary English; the long prompt repeats it.
const paragraph = " A key value cache holds the attention keys and values of every token a model has already seen," +
	" so that each new token is computed from them instead of from the whole text again. Its size grows with" +
	" the prompt and with every generated token, and a server that admits too many long requests at once runs" +
	" out of memory for it before it runs out of compute."

func sweep(o options, stdout, stderr io.Writer) error {
	maxConns := max(o.missConns, 1)
	for _, c := range o.conns {
		maxConns = max(maxConns, c)
	}
	var seq atomic.Uint64
	urls := []string{o.direct, o.nginx, o.kvgate}
	if o.fasthttp != "" {
		urls = append(urls, o.fasthttp)
	}
	var targets []*target
	for i, u := range urls {
		t, err := newTarget(targetNames[i], u, maxConns, &seq)
		if err != nil {
			return err
		}
		t.pid = o.pids[i]
		targets = append(targets, t)
	}
	started := time.Now()
	load := cmp.Or(benchkit.LoadAverage(), "unknown")

	if err := waitReady(targets, o.model, o.ready); err != nil {
		return err
	}
	// Size the long prompt by the backend's own count, then check that
	// every target answers every workload before measuring anything.
	short := workload{model: o.model, prompt: shortPrompt, maxTokens: o.maxTokens}
	shortTokens, err := promptTokens(targets[0], short)
	if err != nil {
		return err
	}
	long := short
	long.prompt = strings.Repeat(paragraph, 4*o.longTokens/len(paragraph)+1)
	n, err := promptTokens(targets[0], long)
	if err != nil {
		return err
	}
	long.prompt = fitPrompt(long.prompt, n-shortTokens, o.longTokens-shortTokens)
	longTokens, err := promptTokens(targets[0], long)
	if err != nil {
		return err
	}

	var cells []*cell
	for _, c := range o.conns {
		for _, stream := range o.streamed {
			for _, p := range []struct {
				label string
				w     workload
			}{{"short", short}, {"long", long}} {
				if !o.prompts[p.label] {
					continue
				}
				w := p.w
				w.stream = stream
				cells = append(cells, &cell{conns: c, w: w, label: p.label, result: make([]sample, len(targets))})
			}
		}
	}
	if o.missConns > 0 {
		for _, p := range []struct {
			label string
			w     workload
		}{{"short unique", short}, {"long unique", long}} {
			if !o.prompts[strings.TrimSuffix(p.label, " unique")] {
				continue
			}
			w := p.w
			w.unique = true
			cells = append(cells, &cell{conns: o.missConns, w: w, label: p.label, result: make([]sample, len(targets))})
		}
	}
	if err := preflight(targets, cells); err != nil {
		return err
	}

	total := time.Duration(o.rounds*len(cells)*len(targets)) * (o.warmup + o.duration)
	fmt.Fprintf(stderr, "overhead: %d cells × %d targets × %d rounds, about %s\n", len(cells), len(targets), o.rounds, total.Round(time.Second))
	for r := range o.rounds {
		for i, c := range cells {
			// Rotate who goes first, so that no target always follows the
			// same one.
			for k := range targets {
				j := (k + r + i) % len(targets)
				s := targets[j].drive(c.w, c.conns, o.warmup, o.duration)
				if s.errors > 0 {
					return fmt.Errorf("%d requests failed at %d connections, %s: %w", s.errors, c.conns, c.name(), s.lastErr)
				}
				c.result[j].add(s)
			}
		}
		fmt.Fprintf(stderr, "overhead: round %d of %d done\n", r+1, o.rounds)
	}

	h := header{
		machine: machine(), load: load, started: started, notes: o.notes,
		shortTokens: shortTokens, longTokens: longTokens, maxTokens: o.maxTokens,
		rounds: o.rounds, duration: o.duration,
	}
	writeTable(stdout, h, cells)
	return nil
}

func (c *cell) name() string {
	s := "not streamed"
	if c.w.stream {
		s = "streamed"
	}
	return c.label + " prompt, " + s
}

// waitReady waits until every target answers a short request, for the
// servers the script has just started.
func waitReady(targets []*target, model string, timeout time.Duration) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	deadline := time.Now().Add(timeout)
	w := workload{model: model, prompt: shortPrompt, maxTokens: 1}
	for _, t := range targets {
		for {
			err := t.do(req, resp, w.body(nil, 0), false)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("not ready after %s: %w", timeout, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// printFreePorts prints n loopback ports that were free a moment ago.
func printFreePorts(n int, stdout, stderr io.Writer) int {
	ports, err := benchkit.FreePorts(n)
	if err != nil {
		fmt.Fprintf(stderr, "overhead: %v\n", err)
		return 1
	}
	for _, p := range ports {
		fmt.Fprintln(stdout, p)
	}
	return 0
}

// preflight sends every cell's request once to every target.
func preflight(targets []*target, cells []*cell) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	for _, t := range targets {
		for _, c := range cells {
			if err := t.do(req, resp, c.w.body(nil, t.seq.Add(1)), c.w.stream); err != nil {
				return fmt.Errorf("before measuring, %s: %w", c.name(), err)
			}
		}
	}
	return nil
}

// promptTokens asks t for one non-streamed answer to w and returns the
// prompt tokens its usage reports.
func promptTokens(t *target, w workload) (int, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	w.stream = false
	if err := t.do(req, resp, w.body(nil, 0), false); err != nil {
		return 0, err
	}
	v, err := fastjson.ParseBytes(resp.Body())
	if err != nil {
		return 0, fmt.Errorf("%s: %w", t.name, err)
	}
	n := v.GetInt("usage", "prompt_tokens")
	if n <= 0 {
		return 0, fmt.Errorf("%s: no usage.prompt_tokens in %.200s", t.name, resp.Body())
	}
	return n, nil
}

// fitPrompt cuts p, which counts have tokens, to about want tokens, at a
// word boundary.
func fitPrompt(p string, have, want int) string {
	if have <= want || have <= 0 {
		return p
	}
	cut := len(p) * want / have
	if i := strings.LastIndexByte(p[:cut], ' '); i > 0 {
		cut = i
	}
	return p[:cut]
}
