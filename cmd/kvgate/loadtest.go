package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mattn/go-isatty"

	"github.com/kvgate/kvgate/loadtest"
)

const loadtestSynopsis = `--target URL [--concurrency 1..256x2 | --rate 1,2,5 | --search] [flags]

Finds the safe concurrency (or request rate) of an OpenAI-compatible server:
the highest load level with no overflow and no server error, peak KV usage
under --max-kv-usage, and p99 latency within the SLOs. Prints the steps as a table
and the answer as one sentence.

Exit codes: 0 a level was safe (for every target compared); 1 none was, the
run was interrupted, or it could not run; 2 bad flags.`

// loadtestFlags are the flags of kvgate loadtest, as given.
type loadtestFlags struct {
	target, compare, model, endpoint, apiKey      string
	concurrency, rate                             string
	search, keepGoing, stream, strict, noSatStop  bool
	searchMax                                     float64
	searchTol                                     string
	requests, warmup, minRequests, maxReruns      int
	sharedPrefix, turns                           int
	duration, reqTimeout, maxStepTime, think      time.Duration
	scrapeInterval, cooldown                      time.Duration
	promptTokens, outputTokens, sessionContext    string
	seed                                          uint64
	maxKV, sloAttainment, confidence              float64
	sloTTFT, sloE2E                               time.Duration
	metricsURL, jsonPath, csvPath, htmlPath, prog string
	price                                         string
}

func (f *loadtestFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.target, "target", "", "base `URL` of the OpenAI-compatible server to load (with or without /v1)")
	fs.StringVar(&f.compare, "compare", "", "run the same test against several targets, `NAME=URL[@PRICE/h],...` (e.g. direct=http://sim:8000,gateway=http://kvgate:8080, or a100=http://a:8000@2.10/h,l4=http://b:8000@0.80/h to compare costs); instead of --target")
	fs.StringVar(&f.price, "price", "", "price of --target per hour, `PRICE/h` such as 2.10/h (any currency): the report adds the cost per million output tokens and of the run")
	fs.StringVar(&f.model, "model", "", "model `NAME` to request (default: the first the target lists at /v1/models)")
	fs.StringVar(&f.endpoint, "endpoint", "chat", "API to load: chat (/v1/chat/completions) or completions (/v1/completions)")
	fs.StringVar(&f.apiKey, "api-key", "", "bearer token sent with every request")
	fs.StringVar(&f.concurrency, "concurrency", "", "closed-loop levels: `LIST` such as 1,2,4,8 or 1..256x2 or 8..64+8 (default "+loadtest.DefaultConcurrency+")")
	fs.StringVar(&f.rate, "rate", "", "open-loop Poisson arrival rates in requests/s: `LIST` such as 1,2,5,10 or 0.5..16x2")
	fs.BoolVar(&f.search, "search", false, "double the level from the first of --concurrency/--rate (default 1) until a step fails, then bisect")
	fs.Float64Var(&f.searchMax, "search-max", loadtest.DefaultSearchMax, "highest level --search tries")
	fs.StringVar(&f.searchTol, "search-tolerance", "", "stop bisecting when the failing level is within this of the safe one: a number, or a percentage such as 10% (default 1 for concurrency, 10% for rate)")
	fs.BoolVar(&f.keepGoing, "keep-going", false, "run every listed level, not stopping at the first failing one")
	fs.IntVar(&f.requests, "requests", 0, "counted requests per step (default max(100, 4×concurrency), or max(100, 20 s of arrivals), when --duration is not given either)")
	fs.DurationVar(&f.duration, "duration", 0, "counted time per step, e.g. 60s; with --requests, whichever ends first")
	fs.IntVar(&f.warmup, "warmup", 0, "uncounted warm-up requests at the start of each step (0: one per concurrent request, or a second of arrivals; -1: none)")
	fs.StringVar(&f.promptTokens, "prompt-tokens", "fixed:512", "prompt length distribution: fixed:N, uniform:A-B, normal:MEAN,SD, lognormal:MEDIAN,SIGMA or file:PATH (one length a line)")
	fs.StringVar(&f.outputTokens, "output-tokens", "fixed:128", "output length (max_tokens) distribution, same forms as --prompt-tokens")
	fs.IntVar(&f.sharedPrefix, "shared-prefix", 0, "open every request with the same system prompt of about `TOKENS` tokens (a system message; on completions the prompt's start), as an application does; --prompt-tokens is then what follows it, still distinct per request")
	fs.IntVar(&f.turns, "turns", 0, "multi-turn sessions of `N` requests: each turn re-sends the session's earlier user messages and the assistant's actual answers before a new user message of --prompt-tokens (closed loop only)")
	fs.StringVar(&f.sessionContext, "session-context", "", "with --turns, the length distribution of a session's first user message, the context every later turn re-sends (documents, files), same forms as --prompt-tokens; later messages follow --prompt-tokens (default: the first follows it too)")
	fs.DurationVar(&f.think, "think-time", 0, "with --turns, a session's mean pause before each later turn (a user reading and typing, an agent's tool running), drawn between half and 1.5× it, e.g. 3s (default 0: at once)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the lengths, the prompts and the arrivals: the same seed repeats the run")
	fs.Float64Var(&f.maxKV, "max-kv-usage", loadtest.DefaultMaxKVUsage, "highest peak KV-cache usage a safe step may reach, as a share (0–1] of the backend's KV block pool (vllm:kv_cache_usage_perc) — not the gateway's ceiling, which is a share of GPU memory")
	fs.Func("ceiling", "renamed --max-kv-usage", func(string) error {
		return errors.New("renamed --max-kv-usage: it is a share of the backend's KV pool, while kvgate's ceiling is a share of GPU memory")
	})
	fs.DurationVar(&f.sloTTFT, "slo-ttft", 0, "time-to-first-token objective, e.g. 500ms (default none)")
	fs.DurationVar(&f.sloE2E, "slo-e2e", 0, "end-to-end latency objective, e.g. 20s (default none)")
	fs.Float64Var(&f.sloAttainment, "slo-attainment", loadtest.DefaultSLOAttainment, "share of requests (0–1] that must meet every SLO, proven by the lower Wilson bound")
	fs.Float64Var(&f.confidence, "confidence", loadtest.DefaultConfidence, "confidence of the SLO-attainment bound, in [0.5, 1)")
	fs.IntVar(&f.minRequests, "min-requests", 0, "fewest completed requests a step is judged on; fewer re-runs it (default min(20, --requests))")
	fs.IntVar(&f.maxReruns, "max-reruns", loadtest.DefaultMaxReruns, "times an inconclusive step is re-run, pooling its requests, before it counts as not safe (0: never)")
	fs.DurationVar(&f.reqTimeout, "request-timeout", loadtest.DefaultRequestTimeout, "time limit of one request")
	fs.DurationVar(&f.maxStepTime, "max-step-time", loadtest.DefaultMaxStepTime, "time limit of one step; requests still in flight are cut")
	fs.StringVar(&f.metricsURL, "metrics-url", "", "Prometheus `URL` scraped for KV usage (default: each target's /metrics); with --compare, one URL for all or NAME=URL,...; none disables")
	fs.DurationVar(&f.scrapeInterval, "scrape-interval", loadtest.DefaultScrapeInterval, "period of the /metrics scrape")
	fs.DurationVar(&f.cooldown, "cooldown", loadtest.DefaultCooldown, "longest wait before each step for the target to be healthy and idle (0: no wait)")
	fs.BoolVar(&f.noSatStop, "no-saturation-stop", false, "do not stop a step early when its TTFT keeps rising while throughput is flat")
	fs.BoolVar(&f.stream, "stream", true, "stream responses (SSE); --stream=false measures whole responses (TTFT = end-to-end)")
	fs.BoolVar(&f.strict, "strict-openai", false, "send only standard OpenAI fields (by default vLLM's ignore_eos and min_tokens pin each output to its max_tokens)")
	fs.StringVar(&f.jsonPath, "json", "", "write the full report, run configuration included, as JSON to `FILE`")
	fs.StringVar(&f.csvPath, "csv", "", "write one row a step as CSV to `FILE`")
	fs.StringVar(&f.htmlPath, "html", "", "write a self-contained HTML report with plots to `FILE`")
	fs.StringVar(&f.prog, "progress", "auto", "progress on stderr: auto (a live bar on a terminal, plain lines otherwise), bar, lines or none")
}

// usageError is a flag value that cannot be used.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func badFlag(flag, format string, a ...any) error {
	return &usageError{msg: "--" + flag + ": " + fmt.Sprintf(format, a...)}
}

// config turns the flags into a loadtest.Config, naming the flag at fault.
func (f *loadtestFlags) config(set map[string]bool) (loadtest.Config, error) {
	var c loadtest.Config
	switch {
	case f.target != "" && f.compare != "":
		return c, badFlag("compare", "give --target or --compare, not both")
	case f.target == "" && f.compare == "":
		return c, badFlag("target", "required: the base URL of the server to load, e.g. --target http://localhost:8000")
	case f.target != "":
		if _, err := loadtest.BaseURL(f.target); err != nil {
			return c, badFlag("target", "%v", err)
		}
		c.Targets = []loadtest.Target{{Name: targetName(f.target), URL: f.target}}
		if f.price != "" {
			p, err := parsePrice(f.price)
			if err != nil {
				return c, badFlag("price", "%v", err)
			}
			c.Targets[0].PricePerHour = p
		}
	case f.price != "":
		return c, badFlag("price", "with --compare, give each target's price there: NAME=URL@PRICE/h")
	default:
		ts, err := parseCompare(f.compare)
		if err != nil {
			return c, err
		}
		c.Targets = ts
	}
	if err := applyMetricsURL(c.Targets, f.metricsURL); err != nil {
		return c, err
	}
	c.Model, c.APIKey, c.NoStream, c.StrictOpenAI = f.model, f.apiKey, !f.stream, f.strict
	switch f.endpoint {
	case "chat", "completions":
		c.Endpoint = f.endpoint
	default:
		return c, badFlag("endpoint", "want chat or completions, got %q", f.endpoint)
	}

	if f.concurrency != "" && f.rate != "" {
		return c, badFlag("rate", "give --concurrency or --rate, not both")
	}
	switch {
	case f.rate != "":
		rs, err := loadtest.ParseRates(f.rate)
		if err != nil {
			return c, badFlag("rate", "%v", err)
		}
		c.Mode, c.Rates = loadtest.ModeRate, rs
	case f.concurrency != "":
		ls, err := loadtest.ParseConcurrency(f.concurrency)
		if err != nil {
			return c, badFlag("concurrency", "%v", err)
		}
		c.Mode, c.Concurrency = loadtest.ModeConcurrency, ls
	default:
		c.Mode = loadtest.ModeConcurrency
	}
	c.Search, c.KeepGoing = f.search, f.keepGoing
	if f.search {
		if f.keepGoing {
			return c, badFlag("keep-going", "a --search decides its own levels; --keep-going applies to a fixed list")
		}
		if !(f.searchMax >= 1) || (c.Mode == loadtest.ModeConcurrency && f.searchMax != float64(int64(f.searchMax))) {
			return c, badFlag("search-max", "want a level of at least 1 (a whole number for concurrency), got %g", f.searchMax)
		}
		c.SearchMax = f.searchMax
		if first := firstLevel(c); c.SearchMax < first {
			return c, badFlag("search-max", "%g is below the first level %g", c.SearchMax, first)
		}
		if f.searchTol != "" {
			abs, rel, err := parseTolerance(f.searchTol)
			if err != nil {
				return c, err
			}
			c.SearchTolerance, c.SearchRelTolerance = abs, rel
		}
	} else {
		for _, name := range []string{"search-max", "search-tolerance"} {
			if set[name] {
				return c, badFlag(name, "only applies with --search")
			}
		}
	}
	if f.requests < 0 {
		return c, badFlag("requests", "must be ≥ 1, got %d", f.requests)
	}
	if set["requests"] && f.requests == 0 {
		return c, badFlag("requests", "must be ≥ 1, got 0")
	}
	if f.duration < 0 || (set["duration"] && f.duration == 0) {
		return c, badFlag("duration", "must be positive, got %s", f.duration)
	}
	if f.warmup < -1 {
		return c, badFlag("warmup", "must be -1 (none), 0 (automatic) or a number of requests, got %d", f.warmup)
	}
	c.Requests, c.Duration, c.Warmup = f.requests, f.duration, f.warmup
	var err error
	if c.PromptTokens, err = loadtest.ParseDist(f.promptTokens, nil); err != nil {
		return c, badFlag("prompt-tokens", "%v", err)
	}
	if c.OutputTokens, err = loadtest.ParseDist(f.outputTokens, nil); err != nil {
		return c, badFlag("output-tokens", "%v", err)
	}
	if f.sharedPrefix < 0 {
		return c, badFlag("shared-prefix", "must be ≥ 0, got %d", f.sharedPrefix)
	}
	if f.turns < 0 {
		return c, badFlag("turns", "must be ≥ 0, got %d", f.turns)
	}
	if f.turns > 1 && c.Mode == loadtest.ModeRate {
		return c, badFlag("turns", "sessions need a closed loop: give --concurrency, not --rate")
	}
	c.SharedPrefixTokens, c.Turns = f.sharedPrefix, f.turns
	if f.think < 0 || f.think > 0 && f.turns <= 1 {
		return c, badFlag("think-time", "must be ≥ 0, and needs --turns above 1; got %s", f.think)
	}
	c.ThinkTime = f.think
	if f.sessionContext != "" {
		if f.turns <= 1 {
			return c, badFlag("session-context", "needs --turns above 1")
		}
		if c.SessionContextTokens, err = loadtest.ParseDist(f.sessionContext, nil); err != nil {
			return c, badFlag("session-context", "%v", err)
		}
	}
	c.Seed = f.seed
	if !(f.maxKV > 0 && f.maxKV <= 1) {
		return c, badFlag("max-kv-usage", "must be in (0, 1], got %g", f.maxKV)
	}
	c.MaxKVUsage = f.maxKV
	if f.sloTTFT < 0 || (set["slo-ttft"] && f.sloTTFT == 0) {
		return c, badFlag("slo-ttft", "must be positive, got %s", f.sloTTFT)
	}
	if f.sloE2E < 0 || (set["slo-e2e"] && f.sloE2E == 0) {
		return c, badFlag("slo-e2e", "must be positive, got %s", f.sloE2E)
	}
	c.SLOTTFT, c.SLOE2E = f.sloTTFT, f.sloE2E
	if !(f.sloAttainment > 0 && f.sloAttainment <= 1) {
		return c, badFlag("slo-attainment", "must be in (0, 1], got %g", f.sloAttainment)
	}
	if !(f.confidence >= 0.5 && f.confidence < 1) {
		return c, badFlag("confidence", "must be in [0.5, 1), got %g", f.confidence)
	}
	c.SLOAttainment, c.Confidence = f.sloAttainment, f.confidence
	if f.minRequests < 0 {
		return c, badFlag("min-requests", "must be ≥ 0, got %d", f.minRequests)
	}
	if f.maxReruns < 0 {
		return c, badFlag("max-reruns", "must be ≥ 0, got %d", f.maxReruns)
	}
	c.MinRequests, c.MaxReruns = f.minRequests, f.maxReruns
	if f.maxReruns == 0 {
		c.MaxReruns = -1 // the library's zero means its default
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		min  time.Duration
	}{{"request-timeout", f.reqTimeout, time.Millisecond}, {"max-step-time", f.maxStepTime, time.Millisecond}, {"scrape-interval", f.scrapeInterval, 10 * time.Millisecond}} {
		if d.v < d.min {
			return c, badFlag(d.name, "must be at least %s, got %s", d.min, d.v)
		}
	}
	c.RequestTimeout, c.MaxStepTime, c.ScrapeInterval = f.reqTimeout, f.maxStepTime, f.scrapeInterval
	switch {
	case f.cooldown < 0:
		return c, badFlag("cooldown", "must be ≥ 0, got %s", f.cooldown)
	case f.cooldown == 0:
		c.Cooldown = -1 // no wait; the library's zero means its default
	default:
		c.Cooldown = f.cooldown
	}
	c.NoSaturationStop = f.noSatStop
	switch f.prog {
	case "auto", "bar", "lines", "none":
	default:
		return c, badFlag("progress", "want auto, bar, lines or none, got %q", f.prog)
	}
	return c, nil
}

// targetName labels a lone --target by its host and port.
func targetName(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		return u.Host
	}
	return "target"
}

func firstLevel(c loadtest.Config) float64 {
	switch {
	case len(c.Rates) > 0:
		return c.Rates[0]
	case len(c.Concurrency) > 0:
		return float64(c.Concurrency[0])
	}
	return 1
}

// parseCompare reads NAME=URL,... into targets.
func parseCompare(s string) ([]loadtest.Target, error) {
	var ts []loadtest.Target
	seen := map[string]bool{}
	for item := range strings.SplitSeq(s, ",") {
		name, u, ok := strings.Cut(strings.TrimSpace(item), "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.Contains(name, "/") {
			return nil, badFlag("compare", "want NAME=URL,... (e.g. direct=http://localhost:8000), got %q", item)
		}
		if seen[name] {
			return nil, badFlag("compare", "target name %q given twice", name)
		}
		seen[name] = true
		u, price, err := splitPrice(u)
		if err != nil {
			return nil, badFlag("compare", "%s: %v", name, err)
		}
		if _, err := loadtest.BaseURL(u); err != nil {
			return nil, badFlag("compare", "%s: %v", name, err)
		}
		ts = append(ts, loadtest.Target{Name: name, URL: u, PricePerHour: price})
	}
	return ts, nil
}

// splitPrice cuts a trailing @PRICE/h off a target's URL. An @ whose tail
// does not end in /h is left to the URL (user@host).
func splitPrice(s string) (string, float64, error) {
	i := strings.LastIndex(s, "@")
	if i < 0 || !strings.HasSuffix(s[i+1:], "/h") {
		return s, 0, nil
	}
	p, err := parsePrice(s[i+1:])
	if err != nil {
		return "", 0, err
	}
	return s[:i], p, nil
}

// parsePrice reads PRICE/h (or a bare PRICE, per hour): a number ≥ 0.
func parsePrice(s string) (float64, error) {
	num := strings.TrimSuffix(strings.TrimSpace(s), "/h")
	p, err := strconv.ParseFloat(num, 64)
	if err != nil || p < 0 || math.IsNaN(p) || math.IsInf(p, 0) {
		return 0, fmt.Errorf("price %q: want a number per hour such as 2.10/h", s)
	}
	return p, nil
}

// applyMetricsURL sets each target's metrics URL from --metrics-url: one URL
// (or none) for every target, or NAME=URL,... naming targets.
func applyMetricsURL(ts []loadtest.Target, s string) error {
	if s == "" {
		return nil
	}
	byName := map[string]int{}
	for i, t := range ts {
		byName[t.Name] = i
	}
	items := strings.Split(s, ",")
	named := 0
	for _, item := range items {
		if name, _, ok := strings.Cut(item, "="); ok {
			if _, known := byName[strings.TrimSpace(name)]; known {
				named++
			}
		}
	}
	switch {
	case named == 0 && len(items) == 1:
		for i := range ts {
			ts[i].MetricsURL = strings.TrimSpace(s)
		}
	case named == len(items):
		for _, item := range items {
			name, u, _ := strings.Cut(item, "=")
			ts[byName[strings.TrimSpace(name)]].MetricsURL = strings.TrimSpace(u)
		}
	default:
		return badFlag("metrics-url", "want one URL, none, or NAME=URL,... with NAME a target of --compare; got %q", s)
	}
	for _, t := range ts {
		if t.MetricsURL != "" && t.MetricsURL != "none" {
			if _, err := loadtest.BaseURL(t.MetricsURL); err != nil {
				return badFlag("metrics-url", "%v", err)
			}
		}
	}
	return nil
}

// parseTolerance reads "4" (absolute) or "10%" (relative to the safe level).
func parseTolerance(s string) (abs, rel float64, err error) {
	if p, ok := strings.CutSuffix(strings.TrimSpace(s), "%"); ok {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || !(v > 0 && v < 100) {
			return 0, 0, badFlag("search-tolerance", "a percentage must be in (0, 100), got %q", s)
		}
		return 0, v / 100, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v > 0) || v > loadtest.MaxRate {
		return 0, 0, badFlag("search-tolerance", "want a positive number or a percentage such as 10%%, got %q", s)
	}
	return v, 0, nil
}

// output is a file named by a flag, opened before the run so that a bad path
// fails in a second, not after an hour of load.
type output struct {
	flag, path string
	f          *os.File
}

func openOutputs(f *loadtestFlags) ([]*output, error) {
	var outs []*output
	for _, o := range []*output{{flag: "json", path: f.jsonPath}, {flag: "csv", path: f.csvPath}, {flag: "html", path: f.htmlPath}} {
		if o.path == "" {
			continue
		}
		file, err := os.Create(o.path)
		if err != nil {
			closeOutputs(outs)
			return nil, badFlag(o.flag, "%v", err)
		}
		o.f = file
		outs = append(outs, o)
	}
	return outs, nil
}

func closeOutputs(outs []*output) {
	for _, o := range outs {
		_ = o.f.Close()
	}
}

func (o *output) write(r *loadtest.Report) error {
	var err error
	switch o.flag {
	case "json":
		err = writeReportJSON(o.f, r)
	case "csv":
		err = loadtest.WriteCSV(o.f, r)
	case "html":
		err = loadtest.WriteHTML(o.f, r)
	}
	if cerr := o.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--%s %s: %w", o.flag, o.path, err)
	}
	return nil
}

func writeReportJSON(w io.Writer, r *loadtest.Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func progressFor(mode string, stderr io.Writer) loadtest.Progress {
	switch mode {
	case "none":
		return nil
	case "bar":
		return loadtest.NewBarProgress(stderr)
	case "lines":
		return loadtest.NewLineProgress(stderr)
	}
	if f, ok := stderr.(*os.File); ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())) {
		return loadtest.NewBarProgress(stderr)
	}
	return loadtest.NewLineProgress(stderr)
}

func runLoadtest(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("loadtest", loadtestSynopsis, stdout, stderr)
	var f loadtestFlags
	f.register(fs)
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	cfg, err := f.config(set)
	if err != nil {
		return fail(stderr, "loadtest", exitUsage, "%v", err)
	}
	outs, err := openOutputs(&f)
	if err != nil {
		return fail(stderr, "loadtest", exitUsage, "%v", err)
	}
	cfg.Progress = progressFor(f.prog, stderr)
	rep, err := loadtest.Run(ctx, cfg)
	if err != nil {
		closeOutputs(outs)
		return fail(stderr, "loadtest", exitNo, "%v", err)
	}
	if err := loadtest.WriteTable(stdout, rep); err != nil {
		closeOutputs(outs)
		return fail(stderr, "loadtest", exitNo, "write: %v", err)
	}
	var werr error
	for _, o := range outs {
		werr = errors.Join(werr, o.write(rep))
	}
	if werr != nil {
		return fail(stderr, "loadtest", exitNo, "%v", werr)
	}
	if rep.Interrupted || !rep.HasSafe {
		return exitNo
	}
	return exitOK
}
