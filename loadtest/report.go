package loadtest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Schema names the JSON layout; it changes when a field changes meaning.
const Schema = "kvgate-loadtest/1"

// Report is everything a run found. Its JSON has, at the top level,
// safe_concurrency (concurrency mode) or safe_rate (rate mode): the safe
// level, or null when no level was safe. With several targets it is the
// lowest of theirs — the level every target sustained — and null if any
// target had none.
type Report struct {
	Mode         Mode           `json:"-"`
	Safe         float64        `json:"-"`
	HasSafe      bool           `json:"-"`
	Answer       string         `json:"answer"`
	FirstFailure *LevelFailure  `json:"first_failure"`
	StopReason   string         `json:"stop_reason"`
	Interrupted  bool           `json:"interrupted"`
	Targets      []TargetReport `json:"targets"`
	Steps        []StepReport   `json:"steps"`
	Config       RunConfig      `json:"config"`
	StartedAt    time.Time      `json:"started_at"`
	FinishedAt   time.Time      `json:"finished_at"`
}

// LevelFailure is where a target first broke and what broke.
type LevelFailure struct {
	Target  string   `json:"target"`
	Level   float64  `json:"level"`
	Reasons []string `json:"reasons"`
}

// TargetReport is one target's answer.
type TargetReport struct {
	Name         string            `json:"name"`
	URL          string            `json:"url"`
	MetricsURL   string            `json:"metrics_url"`
	Model        string            `json:"model"`
	MaxModelLen  int               `json:"max_model_len,omitempty"`
	Mode         Mode              `json:"-"`
	Safe         float64           `json:"-"`
	HasSafe      bool              `json:"-"`
	Answer       string            `json:"answer"`
	FirstFailure *LevelFailure     `json:"first_failure"`
	StopReason   string            `json:"stop_reason"`
	NonMonotonic []float64         `json:"passed_above_first_failure,omitempty"`
	Calibration  PromptCalibration `json:"prompt_calibration"`
	Trials       []TrialReport     `json:"trials"`
	Notes        []string          `json:"notes,omitempty"`
	// PricePerHour is the target's price (0: not priced); CostAtSafe is
	// the cost at the safe level and RunCost what every step of the run
	// cost together, at that price.
	PricePerHour float64 `json:"price_per_hour,omitempty"`
	CostAtSafe   *Cost   `json:"cost_at_safe,omitempty"`
	RunCost      float64 `json:"run_cost,omitempty"`
	steps        []*StepReport
}

// TrialReport is one attempt of the plan, in the order run.
type TrialReport struct {
	Level   float64 `json:"level"`
	Attempt int     `json:"attempt"`
	Verdict string  `json:"verdict"`
	Reason  string  `json:"reason,omitempty"`
}

// MarshalJSON puts safe_concurrency or safe_rate first, null when none.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	return marshalWithSafe(r.Mode, r.Safe, r.HasSafe, plain(r))
}

// MarshalJSON adds safe_concurrency or safe_rate to a target.
func (t TargetReport) MarshalJSON() ([]byte, error) {
	type plain TargetReport
	return marshalWithSafe(t.Mode, t.Safe, t.HasSafe, plain(t))
}

func marshalWithSafe(mode Mode, safe float64, has bool, v any) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	key := "safe_concurrency"
	if mode == ModeRate {
		key = "safe_rate"
	}
	val := []byte("null")
	if has {
		val, _ = json.Marshal(safe)
	}
	out := make([]byte, 0, len(body)+len(key)+len(val)+8)
	out = append(out, `{"schema":"`+Schema+`","mode":"`+string(mode)+`","`+key+`":`...)
	out = append(out, val...)
	if len(body) > 2 {
		out = append(out, ',')
		out = append(out, body[1:]...)
	} else {
		out = append(out, '}')
	}
	return out, nil
}

func (t *TargetReport) setOutcome(o SearchResult, mode Mode) {
	t.Mode = mode
	t.Safe, t.HasSafe = o.Safe, o.HasSafe
	t.StopReason = o.StopReason
	t.NonMonotonic = o.NonMonotonic
	for _, tr := range o.Trials {
		t.Trials = append(t.Trials, TrialReport{Level: tr.Level, Attempt: tr.Attempt, Verdict: tr.Verdict.String(), Reason: tr.Reason})
	}
	if t.Trials == nil {
		t.Trials = []TrialReport{}
	}
	if o.HasFail {
		t.FirstFailure = &LevelFailure{Target: t.Name, Level: o.FirstFail, Reasons: []string{o.FailReason}}
	}
}

// finish orders the steps (by target, then level: a search runs them out of
// order, and its trials keep that order), links them to their targets and
// writes the answers.
func (r *Report) finish(c Config) {
	order := map[string]int{}
	for i, t := range c.Targets {
		order[t.Name] = i
	}
	slices.SortStableFunc(r.Steps, func(a, b StepReport) int {
		if d := order[a.Target] - order[b.Target]; d != 0 {
			return d
		}
		return cmpFloat(a.Level, b.Level)
	})
	for i := range r.Targets {
		t := &r.Targets[i]
		t.steps = nil
		for j := range r.Steps {
			if r.Steps[j].Target == t.Name {
				t.steps = append(t.steps, &r.Steps[j])
			}
		}
		t.price()
		// The first failure's reasons are the pooled step's, in full.
		if t.FirstFailure != nil {
			if s := t.step(t.FirstFailure.Level); s != nil && len(s.Reasons) > 0 {
				t.FirstFailure.Reasons = s.Reasons
			}
		}
		t.Answer = t.answer(c)
	}
	r.HasSafe = len(r.Targets) > 0 && len(r.Targets) == len(c.Targets)
	for i, t := range r.Targets {
		if !t.HasSafe {
			r.HasSafe = false
			break
		}
		if i == 0 || t.Safe < r.Safe {
			r.Safe = t.Safe
		}
	}
	if !r.HasSafe {
		r.Safe = 0
	}
	var answers, stops []string
	for _, t := range r.Targets {
		answers = append(answers, t.Answer)
		stops = append(stops, t.Name+": "+t.StopReason)
		if r.FirstFailure == nil && t.FirstFailure != nil {
			r.FirstFailure = t.FirstFailure
		}
	}
	if r.Interrupted {
		answers = append(answers, "The run was interrupted; levels not run are unknown.")
	}
	r.Answer = strings.Join(answers, "\n")
	if len(r.Targets) == 1 {
		r.StopReason = r.Targets[0].StopReason
	} else {
		r.StopReason = strings.Join(stops, "; ")
	}
}

func (t *TargetReport) step(level float64) *StepReport {
	for _, s := range t.steps {
		if s.Level == level {
			return s
		}
	}
	return nil
}

// answer is the one-sentence result, with the safe step's figures and where
// it first broke.
func (t *TargetReport) answer(c Config) string {
	noun, unit := "concurrency", ""
	if t.Mode == ModeRate {
		noun, unit = "rate", " req/s"
	}
	var b strings.Builder
	if t.HasSafe {
		s := t.step(t.Safe)
		fmt.Fprintf(&b, "Safe %s for %s: %s%s", noun, t.Name, fmtLevel(t.Safe), unit)
		if s != nil {
			fmt.Fprintf(&b, " — %s", stepFigures(s, c))
		}
		b.WriteString(".")
	} else if len(t.steps) == 0 {
		fmt.Fprintf(&b, "No %s level was run for %s (%s).", noun, t.Name, t.StopReason)
		return b.String()
	} else {
		fmt.Fprintf(&b, "No %s level is safe for %s.", noun, t.Name)
	}
	switch ff := t.FirstFailure; {
	case ff != nil:
		fmt.Fprintf(&b, " It first breaks at %s%s: %s.", fmtLevel(ff.Level), unit, strings.Join(ff.Reasons, "; "))
	case t.HasSafe:
		fmt.Fprintf(&b, " No level tried failed (%s).", t.StopReason)
	}
	if t.PricePerHour > 0 {
		fmt.Fprintf(&b, " At %s an hour the run cost %s.", fmtMoney(t.PricePerHour), fmtMoney(t.RunCost))
	}
	return b.String()
}

// stepFigures is a step's headline numbers in words.
func stepFigures(s *StepReport, c Config) string {
	parts := []string{
		fmt.Sprintf("%.2f req/s", s.RequestsPerS),
		fmt.Sprintf("%.0f output tok/s", s.OutputTokensPerS),
	}
	if s.TTFT.N > 0 {
		parts = append(parts, "p99 TTFT "+fmtMs(s.TTFT.P99))
	}
	parts = append(parts, "p99 end-to-end "+fmtMs(s.E2E.P99))
	if s.KV != nil {
		parts = append(parts, fmt.Sprintf("peak KV %.0f%% (limit %.0f%%)", 100*s.KV.PeakUsage, 100*c.MaxKVUsage))
	} else {
		parts = append(parts, "KV usage not measured")
	}
	if s.SLO != nil {
		parts = append(parts, fmt.Sprintf("%.1f%% within SLO (≥ %.1f%% at %.0f%% confidence)", 100*s.SLO.Attainment, 100*s.SLO.Low, 100*s.SLO.Confidence))
	}
	failed := s.Requests.Failed()
	parts = append(parts, fmt.Sprintf("%d failed of %d requests", failed, s.Requests.Sent))
	if s.Requests.Shed > 0 {
		parts = append(parts, fmt.Sprintf("%d shed (429)", s.Requests.Shed))
	}
	if s.Cost != nil && s.Cost.PerMillionOutputTokens != nil {
		parts = append(parts, fmt.Sprintf("%s per million output tokens", fmtMoney(*s.Cost.PerMillionOutputTokens)))
	}
	return strings.Join(parts, ", ")
}

// fmtMs prints milliseconds with the precision a reader needs: seconds
// above one second, whole ms above 10 ms, fractions below.
func fmtMs(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 1:
		return fmt.Sprintf("%.1f ms", v)
	case v == 0:
		return "0 ms"
	}
	return fmt.Sprintf("%.2f ms", v)
}

// RunConfig is the run's configuration as it was run, defaults filled.
type RunConfig struct {
	Targets            []TargetConfig `json:"targets"`
	Model              string         `json:"model"`
	Endpoint           string         `json:"endpoint"`
	Stream             bool           `json:"stream"`
	IgnoreEOS          bool           `json:"ignore_eos"`
	Mode               Mode           `json:"mode"`
	Levels             []float64      `json:"levels"`
	Search             bool           `json:"search"`
	SearchMax          float64        `json:"search_max,omitempty"`
	SearchTolerance    float64        `json:"search_tolerance,omitempty"`
	SearchRelTolerance float64        `json:"search_rel_tolerance,omitempty"`
	KeepGoing          bool           `json:"keep_going"`
	Requests           int            `json:"requests_per_step"`
	DurationS          float64        `json:"duration_per_step_s"`
	Warmup             int            `json:"warmup"`
	PromptTokens       string         `json:"prompt_tokens"`
	OutputTokens       string         `json:"output_tokens"`
	Seed               uint64         `json:"seed"`
	SharedPrefixTokens int            `json:"shared_prefix_tokens,omitempty"`
	Turns              int            `json:"turns,omitempty"`
	SessionContext     string         `json:"session_context_tokens,omitempty"`
	ThinkTimeS         float64        `json:"think_time_s,omitempty"`
	MaxKVUsage         float64        `json:"max_kv_usage"`
	SLOTTFTMs          float64        `json:"slo_ttft_ms"`
	SLOE2EMs           float64        `json:"slo_e2e_ms"`
	SLOAttainment      float64        `json:"slo_attainment"`
	Confidence         float64        `json:"confidence"`
	MinRequests        int            `json:"min_requests"`
	MaxReruns          int            `json:"max_reruns"`
	RequestTimeoutS    float64        `json:"request_timeout_s"`
	MaxStepTimeS       float64        `json:"max_step_time_s"`
	MaxInFlight        int            `json:"max_in_flight"`
	ScrapeIntervalS    float64        `json:"scrape_interval_s"`
	CooldownS          float64        `json:"cooldown_s"`
	SaturationStop     bool           `json:"saturation_stop"`
}

// TargetConfig is a target as configured.
type TargetConfig struct {
	Name         string  `json:"name"`
	URL          string  `json:"url"`
	MetricsURL   string  `json:"metrics_url,omitempty"`
	PricePerHour float64 `json:"price_per_hour,omitempty"`
}

func echoConfig(c Config) RunConfig {
	rc := RunConfig{
		Model: c.Model, Endpoint: c.Endpoint, Stream: !c.NoStream, IgnoreEOS: !c.StrictOpenAI,
		Mode: c.Mode, Levels: c.levels(), Search: c.Search, KeepGoing: c.KeepGoing,
		Requests: c.Requests, DurationS: c.Duration.Seconds(), Warmup: c.Warmup,
		PromptTokens: c.PromptTokens.String(), OutputTokens: c.OutputTokens.String(), Seed: c.Seed,
		SharedPrefixTokens: c.SharedPrefixTokens, Turns: c.Turns, ThinkTimeS: c.ThinkTime.Seconds(),
		MaxKVUsage: c.MaxKVUsage, SLOTTFTMs: ms(c.SLOTTFT), SLOE2EMs: ms(c.SLOE2E), SLOAttainment: c.SLOAttainment,
		Confidence: c.Confidence, MinRequests: c.MinRequests, MaxReruns: c.MaxReruns,
		RequestTimeoutS: c.RequestTimeout.Seconds(), MaxStepTimeS: c.MaxStepTime.Seconds(), MaxInFlight: c.MaxInFlight,
		ScrapeIntervalS: c.ScrapeInterval.Seconds(), CooldownS: max(c.Cooldown, 0).Seconds(), SaturationStop: !c.NoSaturationStop,
	}
	if c.SessionContextTokens != nil {
		rc.SessionContext = c.SessionContextTokens.String()
	}
	if c.Search {
		rc.SearchMax, rc.SearchTolerance, rc.SearchRelTolerance = c.SearchMax, c.SearchTolerance, c.SearchRelTolerance
	}
	for _, t := range c.Targets {
		rc.Targets = append(rc.Targets, TargetConfig{Name: t.Name, URL: t.URL, MetricsURL: t.MetricsURL, PricePerHour: t.PricePerHour})
	}
	return rc
}

func describeCalibration(c PromptCalibration) string {
	switch {
	case c.Source == "estimate":
		return "estimate (no /tokenize: one token a word)"
	case c.From != "":
		return fmt.Sprintf("%s's /tokenize (checked: max error %d tokens)", c.From, c.MaxAbsError)
	}
	return fmt.Sprintf("/tokenize (checked on %d prompts: max error %d tokens)", c.Checked, c.MaxAbsError)
}
