package loadtest

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Target is one OpenAI-compatible server to load.
type Target struct {
	// Name labels the target in tables and plots; default "target".
	Name string
	// URL is the server's base URL, with or without a trailing /v1.
	URL string
	// MetricsURL is where its /metrics is scraped. "" means URL's own
	// /metrics (tried once; a target without one runs unmeasured, with a
	// note); "none" disables scraping. An explicit URL must answer.
	MetricsURL string
	// PricePerHour is what the target costs an hour (its GPUs' rental, say),
	// in any currency; reports then give the cost per million output tokens
	// and of each step. 0 = not priced.
	PricePerHour float64
}

// Config is one load test. Every field states its default; Run fills them.
type Config struct {
	// Targets are run one after the other with the same workload and plan.
	Targets []Target
	// Model is the model name sent; "" means the first model each target
	// lists at /v1/models.
	Model string
	// Endpoint is "chat" (/v1/chat/completions, default) or "completions".
	Endpoint string
	// NoStream sends non-streaming requests; TTFT then equals end-to-end
	// latency and there is no inter-token latency.
	NoStream bool
	// StrictOpenAI sends only standard OpenAI fields. By default loadtest
	// also sends vLLM's ignore_eos and min_tokens so that every request
	// generates exactly its max_tokens and every level does the same work.
	StrictOpenAI bool
	// APIKey, when set, is sent as a bearer token.
	APIKey string

	// Mode is ModeConcurrency (default) or ModeRate.
	Mode Mode
	// Concurrency levels (ModeConcurrency), ascending; default 1..256x2.
	// With Search, the first is where the search starts (default 1).
	Concurrency []int
	// Rates in requests per second (ModeRate), ascending; required in that
	// mode. With Search, the first is where the search starts.
	Rates []float64
	// Search doubles and bisects instead of running a fixed list.
	Search bool
	// SearchMax is the highest level a search tries; default 1024.
	SearchMax float64
	// SearchTolerance: the search stops when the first failing level is
	// within this of the last safe one; default 1 (concurrency) or 0 with
	// SearchRelTolerance 0.1 (rate).
	SearchTolerance    float64
	SearchRelTolerance float64
	// KeepGoing runs a fixed list past its first failing level.
	KeepGoing bool

	// Requests counted per step (per attempt); Duration of the counted part
	// of each step. Either, or both (whichever ends first). With neither,
	// Requests is max(100, 4×concurrency) or max(100, 20 s of arrivals).
	Requests int
	Duration time.Duration
	// Warmup requests are sent at the start of each attempt and not
	// counted. 0 means one per concurrent worker (closed loop) or about a
	// second of arrivals (open loop); negative means none.
	Warmup int

	// PromptTokens and OutputTokens are the length distributions; default
	// fixed:512 and fixed:128. Output length is sent as max_tokens.
	PromptTokens Dist
	OutputTokens Dist
	// SharedPrefixTokens, when positive, opens every request of a step with
	// the same text of about that many tokens (a system message on chat,
	// the prompt's start on completions), as an application's system
	// prompt does, so that a server's prefix cache may hold it once.
	// PromptTokens is then the length of what follows it, which stays
	// distinct per request. The text differs between steps, so each step
	// starts with a cold cache. Default 0: none.
	SharedPrefixTokens int
	// Turns, above 1, makes each worker of a closed loop hold multi-turn
	// sessions of Turns requests: every turn re-sends the session's
	// history, its earlier user messages and the assistant's actual
	// answers, before a new user message of PromptTokens. A failed turn,
	// or one whose next turn would not fit the model's context, ends its
	// session early. Concurrency mode only. Default 0 (or 1): every request
	// stands alone.
	Turns int
	// SessionContextTokens, with Turns, is the length distribution of a
	// session's first user message: the context it is about (documents a
	// RAG application retrieved, the files an agent opened), which every
	// later turn re-sends with the history while its own message is drawn
	// from PromptTokens. Default nil: the first message is drawn from
	// PromptTokens too.
	SessionContextTokens Dist
	// ThinkTime, with Turns, is the mean pause of a session before each of
	// its later turns (a user reading the answer and typing, an agent's
	// tool running), drawn uniformly between half and one and a half of
	// it: meanwhile the other sessions' requests reach the servers, as
	// they do between a real session's turns. Default 0: the next turn
	// is sent the moment the answer ends.
	ThinkTime time.Duration
	// Seed makes the workload and the arrivals repeat; any value is valid.
	Seed uint64

	// MaxKVUsage is the highest peak KV-cache usage (0–1] a safe step may show,
	// as a share of the backend's KV block pool (not of GPU memory: that is
	// what the gateway's and plan's ceiling mean);
	// default 0.75.
	MaxKVUsage float64
	// SLOTTFT and SLOE2E are latency objectives; 0 means none.
	SLOTTFT time.Duration
	SLOE2E  time.Duration
	// SLOAttainment is the share of requests (0–1) that must meet every SLO;
	// default 0.99.
	SLOAttainment float64
	// Confidence of the attainment bounds (0.5–1); default 0.95.
	Confidence float64
	// MinRequests is the fewest completed requests a step is judged on;
	// default min(20, Requests).
	MinRequests int
	// MaxReruns is how often an inconclusive step is run again (adding to
	// its evidence) before it counts as not safe; default 2, negative 0.
	MaxReruns int

	// RequestTimeout bounds one request; default 5m.
	RequestTimeout time.Duration
	// MaxStepTime bounds one attempt, in-flight requests cut; default 30m.
	MaxStepTime time.Duration
	// MaxInFlight bounds an open loop's concurrent requests; default 10000.
	MaxInFlight int
	// ScrapeInterval is the /metrics period; default 250ms: a KV peak that
	// lasts a few decode steps must show on the memory curve, and one
	// scrape of a vLLM /metrics is a few tens of KiB.
	ScrapeInterval time.Duration
	// Cooldown is the longest wait, before each step, for the target to
	// report no running or waiting requests; default 30s, negative none.
	Cooldown time.Duration
	// NoSaturationStop disables the over-saturation stop; Saturation tunes it.
	NoSaturationStop bool
	Saturation       SaturationConfig

	// Clock is the time source; default SystemClock.
	Clock Clock
	// HTTPClient sends the load; default NewHTTPClient sized to the plan.
	HTTPClient *http.Client
	// Progress is told about each step; nil means silent.
	Progress Progress
	// Logger receives debug detail; nil discards it.
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultMaxKVUsage     = 0.75
	DefaultSLOAttainment  = 0.99
	DefaultConfidence     = 0.95
	DefaultMaxReruns      = 2
	DefaultRequestTimeout = 5 * time.Minute
	DefaultMaxStepTime    = 30 * time.Minute
	DefaultScrapeInterval = 250 * time.Millisecond
	DefaultCooldown       = 30 * time.Second
	DefaultSearchMax      = 1024
	DefaultMaxInFlight    = 10_000
	defaultMinRequests    = 20
	// maxSharedPrefix bounds SharedPrefixTokens at a context no model
	// serves, so a typo fails at once rather than building a huge prompt.
	maxSharedPrefix = 1 << 20
)

// DefaultConcurrency is the sweep run when no levels are given.
const DefaultConcurrency = "1..256x2"

// withDefaults fills defaults and refuses unsafe or contradictory settings,
// naming the field.
func (c Config) withDefaults() (Config, error) {
	if len(c.Targets) == 0 {
		return c, errors.New("Targets: at least one target is needed")
	}
	seen := map[string]bool{}
	targets := make([]Target, len(c.Targets))
	for i, t := range c.Targets {
		if t.Name == "" {
			t.Name = "target"
			if len(c.Targets) > 1 {
				t.Name = fmt.Sprintf("target%d", i+1)
			}
		}
		if seen[t.Name] {
			return c, fmt.Errorf("Targets: name %q used twice", t.Name)
		}
		seen[t.Name] = true
		base, err := BaseURL(t.URL)
		if err != nil {
			return c, fmt.Errorf("Targets[%s].URL: %w", t.Name, err)
		}
		t.URL = base
		if t.MetricsURL != "" && t.MetricsURL != "none" {
			if _, err := checkURL(t.MetricsURL); err != nil {
				return c, fmt.Errorf("Targets[%s].MetricsURL: %w", t.Name, err)
			}
		}
		if t.PricePerHour < 0 || math.IsNaN(t.PricePerHour) || math.IsInf(t.PricePerHour, 0) {
			return c, fmt.Errorf("Targets[%s].PricePerHour: want a price ≥ 0, got %g", t.Name, t.PricePerHour)
		}
		targets[i] = t
	}
	c.Targets = targets
	switch c.Endpoint {
	case "":
		c.Endpoint = "chat"
	case "chat", "completions":
	default:
		return c, fmt.Errorf("Endpoint: want chat or completions, got %q", c.Endpoint)
	}
	switch c.Mode {
	case "":
		c.Mode = ModeConcurrency
		if len(c.Rates) > 0 {
			c.Mode = ModeRate
		}
	case ModeConcurrency, ModeRate:
	default:
		return c, fmt.Errorf("Mode: want %q or %q, got %q", ModeConcurrency, ModeRate, c.Mode)
	}
	if c.Mode == ModeConcurrency && len(c.Rates) > 0 || c.Mode == ModeRate && len(c.Concurrency) > 0 {
		return c, errors.New("Concurrency and Rates: give one, not both")
	}
	if c.Mode == ModeConcurrency && len(c.Concurrency) == 0 {
		if c.Search {
			c.Concurrency = []int{1}
		} else {
			c.Concurrency, _ = ParseConcurrency(DefaultConcurrency)
		}
	}
	if c.Mode == ModeRate && len(c.Rates) == 0 {
		if !c.Search {
			return c, errors.New("Rates: an open-loop run needs at least one rate")
		}
		c.Rates = []float64{1}
	}
	for i, l := range c.Concurrency {
		if l < 1 || l > MaxConcurrency || (i > 0 && l <= c.Concurrency[i-1]) {
			return c, fmt.Errorf("Concurrency: levels must be in [1, %d] and ascending, got %v", MaxConcurrency, c.Concurrency)
		}
	}
	for i, r := range c.Rates {
		if !(r > 0) || r > MaxRate || (i > 0 && r <= c.Rates[i-1]) {
			return c, fmt.Errorf("Rates: rates must be in (0, %g] and ascending, got %v", MaxRate, c.Rates)
		}
	}
	if c.Search {
		if c.SearchMax == 0 {
			c.SearchMax = DefaultSearchMax
		}
		start := c.levels()[0]
		if c.SearchMax < start || math.IsNaN(c.SearchMax) {
			return c, fmt.Errorf("SearchMax: %g is below the first level %g", c.SearchMax, start)
		}
		if c.Mode == ModeConcurrency && (c.SearchMax != math.Trunc(c.SearchMax) || c.SearchMax > MaxConcurrency) {
			return c, fmt.Errorf("SearchMax: want a whole concurrency up to %d, got %g", MaxConcurrency, c.SearchMax)
		}
		if c.SearchTolerance < 0 || c.SearchRelTolerance < 0 || c.SearchRelTolerance >= 1 {
			return c, fmt.Errorf("SearchTolerance: must be ≥ 0 (relative: in [0, 1)), got %g and %g", c.SearchTolerance, c.SearchRelTolerance)
		}
		if c.SearchTolerance == 0 && c.SearchRelTolerance == 0 {
			if c.Mode == ModeConcurrency {
				c.SearchTolerance = 1
			} else {
				c.SearchRelTolerance = 0.1
			}
		}
	}
	if c.Requests < 0 {
		return c, fmt.Errorf("Requests: must be ≥ 0, got %d", c.Requests)
	}
	if c.Duration < 0 {
		return c, fmt.Errorf("Duration: must be ≥ 0, got %s", c.Duration)
	}
	if c.SharedPrefixTokens < 0 || c.SharedPrefixTokens > maxSharedPrefix {
		return c, fmt.Errorf("SharedPrefixTokens: must be in [0, %d], got %d", maxSharedPrefix, c.SharedPrefixTokens)
	}
	if c.Turns < 0 {
		return c, fmt.Errorf("Turns: must be ≥ 0, got %d", c.Turns)
	}
	if c.ThinkTime < 0 || c.ThinkTime > 0 && c.Turns <= 1 {
		return c, fmt.Errorf("ThinkTime: must be ≥ 0, and only with Turns above 1; got %s", c.ThinkTime)
	}
	if c.SessionContextTokens != nil && c.Turns <= 1 {
		return c, errors.New("SessionContextTokens: a session's context needs Turns above 1")
	}
	if c.Turns > 1 && c.Mode != ModeConcurrency {
		return c, errors.New("Turns: sessions need a closed loop (Concurrency), not Rates")
	}
	if c.PromptTokens == nil {
		c.PromptTokens = fixed(512)
	}
	if c.OutputTokens == nil {
		c.OutputTokens = fixed(128)
	}
	if c.MaxKVUsage == 0 {
		c.MaxKVUsage = DefaultMaxKVUsage
	}
	if !(c.MaxKVUsage > 0 && c.MaxKVUsage <= 1) {
		return c, fmt.Errorf("MaxKVUsage: must be in (0, 1], got %g", c.MaxKVUsage)
	}
	if c.SLOTTFT < 0 || c.SLOE2E < 0 {
		return c, errors.New("SLOTTFT, SLOE2E: must be ≥ 0")
	}
	if c.SLOAttainment == 0 {
		c.SLOAttainment = DefaultSLOAttainment
	}
	if !(c.SLOAttainment > 0 && c.SLOAttainment <= 1) {
		return c, fmt.Errorf("SLOAttainment: must be in (0, 1], got %g", c.SLOAttainment)
	}
	if c.Confidence == 0 {
		c.Confidence = DefaultConfidence
	}
	if !(c.Confidence >= 0.5 && c.Confidence < 1) {
		return c, fmt.Errorf("Confidence: must be in [0.5, 1), got %g", c.Confidence)
	}
	if c.MinRequests < 0 {
		return c, fmt.Errorf("MinRequests: must be ≥ 0, got %d", c.MinRequests)
	}
	if c.MinRequests == 0 {
		c.MinRequests = defaultMinRequests
		if c.Requests > 0 {
			c.MinRequests = min(c.MinRequests, c.Requests)
		}
	}
	if c.MaxReruns == 0 {
		c.MaxReruns = DefaultMaxReruns
	}
	c.MaxReruns = max(c.MaxReruns, 0)
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.MaxStepTime == 0 {
		c.MaxStepTime = DefaultMaxStepTime
	}
	if c.RequestTimeout < 0 || c.MaxStepTime < 0 {
		return c, errors.New("RequestTimeout, MaxStepTime: must be positive")
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxInFlight < 0 {
		return c, fmt.Errorf("MaxInFlight: must be positive, got %d", c.MaxInFlight)
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = DefaultScrapeInterval
	}
	if c.ScrapeInterval < 10*time.Millisecond {
		return c, fmt.Errorf("ScrapeInterval: must be at least 10ms, got %s", c.ScrapeInterval)
	}
	if c.Cooldown == 0 {
		c.Cooldown = DefaultCooldown
	}
	if c.Clock == nil {
		c.Clock = SystemClock{}
	}
	if c.HTTPClient == nil {
		c.HTTPClient = NewHTTPClient(int(min(c.maxLevel(), float64(c.MaxInFlight))) + 16)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Progress == nil {
		c.Progress = nopProgress{}
	}
	return c, nil
}

// levels is the plan's level list as numbers.
func (c Config) levels() []float64 {
	if c.Mode == ModeRate {
		return append([]float64(nil), c.Rates...)
	}
	out := make([]float64, len(c.Concurrency))
	for i, l := range c.Concurrency {
		out[i] = float64(l)
	}
	return out
}

func (c Config) maxLevel() float64 {
	if c.Search {
		return c.SearchMax
	}
	ls := c.levels()
	return ls[len(ls)-1]
}

func (c Config) plan() Plan {
	ls := c.levels()
	return Plan{
		Levels: ls, KeepGoing: c.KeepGoing,
		Search: c.Search, Start: ls[0], Max: c.SearchMax,
		Tolerance: c.SearchTolerance, RelTolerance: c.SearchRelTolerance,
		Integer: c.Mode == ModeConcurrency, MaxReruns: c.MaxReruns,
	}
}

// requestsFor is the counted requests of one attempt at level.
func (c Config) requestsFor(level float64) int {
	if c.Requests > 0 || c.Duration > 0 {
		return c.Requests
	}
	if c.Mode == ModeRate {
		return max(100, int(math.Ceil(level*20)))
	}
	return max(100, 4*int(level))
}

func (c Config) warmupFor(level float64) int {
	switch {
	case c.Warmup < 0:
		return 0
	case c.Warmup > 0:
		return c.Warmup
	case c.Mode == ModeRate:
		return max(1, int(math.Ceil(level)))
	}
	return int(level)
}

// BaseURL normalises a target URL: scheme and host required, a trailing
// slash or /v1 dropped, so both http://h:8000 and http://h:8000/v1/ work.
func BaseURL(raw string) (string, error) {
	u, err := checkURL(raw)
	if err != nil {
		return "", err
	}
	p := strings.TrimRight(u.Path, "/")
	p = strings.TrimSuffix(p, "/v1")
	u.Path, u.RawQuery, u.Fragment = p, "", ""
	return strings.TrimRight(u.String(), "/"), nil
}

func checkURL(raw string) (*url.URL, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, errors.New("empty URL")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%q is not a URL: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%q: want an http:// or https:// URL", raw)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%q: no host", raw)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%q: credentials in the URL are not sent; use an API key", redact(u))
	}
	return u, nil
}

func redact(u *url.URL) string {
	c := *u
	c.User = nil
	return c.String()
}
