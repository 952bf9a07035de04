package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"time"
)

// Run runs the load test cfg describes against each target in turn and
// reports what it found. An error means the test could not run (a bad
// config, a target that does not answer); a run that finds nothing safe is
// not an error. Cancelling ctx ends the run early with what it has, marked
// interrupted.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	rep := &Report{Mode: c.Mode, StartedAt: c.Clock.Now(), Config: echoConfig(c), Steps: []StepReport{}}
	metricsClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	// Idle keep-alive connections would hold the targets' graceful
	// shutdowns open after the run; let them go.
	defer metricsClient.CloseIdleConnections()
	defer c.HTTPClient.CloseIdleConnections()

	// Prepare every target first so that a target without /tokenize can
	// borrow the calibration of one with it (the gateway in front of the
	// sim it compares against, for instance).
	preps := make([]*prepared, len(c.Targets))
	for i, t := range c.Targets {
		p, err := prepare(ctx, c, t, metricsClient)
		if err != nil {
			return nil, err
		}
		preps[i] = p
	}
	var donor *prepared
	for _, p := range preps {
		if p.gen != nil {
			donor = p
			break
		}
	}
	for _, p := range preps {
		switch {
		case p.gen != nil:
		case donor != nil:
			p.gen = donor.gen
			p.report.Calibration = donor.report.Calibration
			p.report.Calibration.From = donor.report.Name
			p.report.Calibration.Note = fmt.Sprintf("%s has no /tokenize (%s); prompt lengths measured with %s's", p.report.Name, p.tokErr, donor.report.Name)
		default:
			p.gen = estimatedPromptGen()
			p.report.Calibration = PromptCalibration{Source: "estimate",
				Note: fmt.Sprintf("no target could tokenize (%s); prompt lengths assume one token a word", p.tokErr)}
		}
		c.Progress.Message(fmt.Sprintf("%s: model %s, prompt lengths by %s", p.report.Name, p.model, describeCalibration(p.report.Calibration)))
	}

	run := &runSteps{start: c.Clock.Now()}
	if !c.Search {
		run.planned = len(c.levels()) * len(preps)
	}
	for ti, p := range preps {
		out, err := runTarget(ctx, c, ti, p, metricsClient, rep, run)
		if err != nil {
			return nil, err
		}
		p.report.setOutcome(out, c.Mode)
		rep.Targets = append(rep.Targets, p.report)
		if out.Interrupted {
			rep.Interrupted = true
			break
		}
	}
	rep.finish(c)
	rep.FinishedAt = c.Clock.Now()
	return rep, nil
}

// prepared is a target ready to load.
type prepared struct {
	target     Target
	model      string
	sender     *httpSender
	metricsURL string // "" when none
	gen        *promptGen
	tokErr     string
	report     TargetReport
}

func prepare(ctx context.Context, c Config, t Target, metricsClient *http.Client) (*prepared, error) {
	p := &prepared{target: t, model: c.Model}
	p.report = TargetReport{Name: t.Name, URL: t.URL, PricePerHour: t.PricePerHour}
	info, err := listModels(ctx, c.HTTPClient, t.URL, c.APIKey)
	switch {
	case err != nil && c.Model == "":
		return nil, fmt.Errorf("target %s: cannot find a model to load (pass --model): %w", t.Name, err)
	case err != nil:
		// A server without /v1/models can still serve the named model.
	case c.Model == "":
		p.model = info.first
	}
	if info.maxModelLen[p.model] > 0 {
		p.report.MaxModelLen = info.maxModelLen[p.model]
	}
	p.report.Model = p.model
	path := "/v1/chat/completions"
	if c.Endpoint == "completions" {
		path = "/v1/completions"
	}
	p.sender = &httpSender{
		client: c.HTTPClient, url: t.URL + path, model: p.model, chat: c.Endpoint == "chat",
		stream: !c.NoStream, ignoreEOS: !c.StrictOpenAI, apiKey: c.APIKey, timeout: c.RequestTimeout, clock: c.Clock,
	}

	// Metrics: an explicit URL must answer; the implied one may be absent.
	switch t.MetricsURL {
	case "none":
		p.report.MetricsURL = ""
	case "":
		u := t.URL + "/metrics"
		if _, err := scrapeMetrics(ctx, metricsClient, u, 5*time.Second); err == nil {
			p.metricsURL = u
		} else {
			p.report.Notes = append(p.report.Notes, "KV usage not measured: "+err.Error())
		}
	default:
		if _, err := scrapeMetrics(ctx, metricsClient, t.MetricsURL, 5*time.Second); err != nil {
			return nil, fmt.Errorf("target %s: --metrics-url: %w", t.Name, err)
		}
		p.metricsURL = t.MetricsURL
	}
	p.report.MetricsURL = p.metricsURL

	// Prompt lengths, fitted with the target's tokenizer when it has one.
	tok := &httpTokenizer{client: c.HTTPClient, url: t.URL + "/tokenize", model: p.model, apiKey: c.APIKey}
	r := rand.New(rand.NewPCG(c.Seed, 0xc4ec45))
	checks := make([]int, 8)
	for i := range checks {
		checks[i] = c.PromptTokens.Sample(r)
	}
	gen, cal, err := calibrate(ctx, tok, c.Endpoint == "chat", checks, c.Seed)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		p.tokErr = err.Error()
	} else {
		p.gen, p.report.Calibration = gen, cal
	}
	if n := tok.MaxModelLen(); n > 0 && p.report.MaxModelLen == 0 {
		p.report.MaxModelLen = n
	}
	return p, nil
}

type modelsInfo struct {
	first       string
	maxModelLen map[string]int
}

func listModels(ctx context.Context, c *http.Client, base, apiKey string) (modelsInfo, error) {
	info := modelsInfo{maxModelLen: map[string]int{}}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return info, err
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := c.Do(req)
	if err != nil {
		return info, fmt.Errorf("GET /v1/models: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return info, fmt.Errorf("GET /v1/models: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return info, fmt.Errorf("GET /v1/models: %s", errorMessage(body, resp.Status))
	}
	var m struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return info, fmt.Errorf("GET /v1/models: %w", err)
	}
	for _, d := range m.Data {
		if info.first == "" {
			info.first = d.ID
		}
		info.maxModelLen[d.ID] = d.MaxModelLen
	}
	if info.first == "" {
		return info, errors.New("GET /v1/models: no models listed")
	}
	return info, nil
}

// workload makes request i of one attempt. Lengths depend on the seed, the
// attempt and i only, so every level of every target sees the same sequence
// of lengths; the words also depend on the target and the level, so no two
// requests share a prefix a server could cache, but for the shared prefix
// when one is asked for.
type workload struct {
	c           Config
	gen         *promptGen
	maxModelLen int
	attempt     int
	salt        uint64
	prefix      string // the step's shared prefix; "" for none
}

func newWorkload(c Config, gen *promptGen, maxModelLen, attempt int, salt uint64) workload {
	w := workload{c: c, gen: gen, maxModelLen: maxModelLen, attempt: attempt, salt: salt}
	if c.SharedPrefixTokens > 0 {
		// Built as a prompt of its own, without the chat template's
		// overhead, which the user message that follows already counts.
		plain := *gen
		plain.overhead = 0
		w.prefix, _ = plain.build(rand.New(rand.NewPCG(c.Seed^salt, uint64(attempt)<<40|1<<39)), c.SharedPrefixTokens)
	}
	return w
}

func (w workload) spec(i int) RequestSpec { return w.draw(i, w.c.PromptTokens) }

// opening makes request i the first turn of a session: its user message is
// the session's context when the run has one.
func (w workload) opening(i int) RequestSpec {
	if w.c.SessionContextTokens == nil {
		return w.spec(i)
	}
	return w.draw(i, w.c.SessionContextTokens)
}

func (w workload) draw(i int, prompt Dist) RequestSpec {
	lr := rand.New(rand.NewPCG(w.c.Seed, uint64(w.attempt)<<40|uint64(i)))
	p, o := prompt.Sample(lr), w.c.OutputTokens.Sample(lr)
	shared := w.c.SharedPrefixTokens
	if m := w.maxModelLen - shared; m > 1 && p+o > m {
		o = min(o, m-1)
		p = m - o
	}
	tr := rand.New(rand.NewPCG(w.c.Seed^w.salt, uint64(w.attempt)<<40|uint64(i)))
	text, _ := w.gen.build(tr, p)
	return RequestSpec{Index: i, Prompt: text, System: w.prefix, PromptTokens: shared + p, MaxTokens: o}
}

// runSteps counts the run's steps, for its progress.
type runSteps struct {
	start   time.Time
	planned int // 0: a search decides
	begun   int
}

func runTarget(ctx context.Context, c Config, ti int, p *prepared, metricsClient *http.Client, rep *Report, run *runSteps) (SearchResult, error) {
	aggs := map[float64]*levelAgg{}
	stepIndex := map[float64]int{}
	slo := sloLimits{ttft: c.SLOTTFT, e2e: c.SLOE2E}
	crit := criteria{ceiling: c.MaxKVUsage, slo: slo, minRequests: c.MinRequests, timeout: c.RequestTimeout}
	var scrape func(context.Context) (MetricsSample, error)
	if p.metricsURL != "" {
		scrape = func(ctx context.Context) (MetricsSample, error) {
			return scrapeMetrics(ctx, metricsClient, p.metricsURL, 2*time.Second)
		}
	}
	ready := func(ctx context.Context) bool { return targetReady(ctx, metricsClient, p.target.URL) }
	judgeFn := func(ctx context.Context, level float64, attemptNo int) (Judgement, error) {
		g := aggs[level]
		if g == nil {
			g = &levelAgg{mode: c.Mode, level: level, target: p.target.Name}
			aggs[level] = g
		}
		if c.Cooldown > 0 {
			waitIdle(ctx, c.Clock, scrape, ready, c.Cooldown)
		}
		run.begun++
		info := StepInfo{Target: p.target.Name, Mode: c.Mode, Level: level, Attempt: attemptNo,
			Requests: c.requestsFor(level), Duration: c.Duration,
			Step: run.begun, Steps: max(run.planned, 0), RunElapsed: c.Clock.Now().Sub(run.start)}
		if attemptNo > 0 && run.planned > 0 {
			run.planned++ // a re-run is a step more
			info.Steps = run.planned
		}
		c.Progress.StepStart(info)
		w := newWorkload(c, p.gen, p.report.MaxModelLen, attemptNo, uint64(ti+1)<<48^math.Float64bits(level))
		sc := stepConfig{
			Mode: c.Mode, Level: level, Requests: c.requestsFor(level), Duration: c.Duration,
			Warmup: c.warmupFor(level), MaxStepTime: c.MaxStepTime, MaxInFlight: c.MaxInFlight,
			ArrivalSeed: c.Seed ^ uint64(attemptNo)<<32, Scrape: scrape, ScrapeInterval: c.ScrapeInterval,
			Turns: c.Turns, Opening: w.opening, Think: c.ThinkTime, SharedTokens: c.SharedPrefixTokens, MaxContext: p.report.MaxModelLen,
			Progress:         func(s ProgressSnapshot) { c.Progress.StepUpdate(info, s) },
			ProgressInterval: 200 * time.Millisecond,
		}
		if !c.NoSaturationStop {
			sat := c.Saturation
			sc.Saturation = &sat
		}
		a := runAttempt(ctx, c.Clock, p.sender, w.spec, sc)
		g.add(a, slo, p.metricsURL)
		s := g.report(slo, c.SLOAttainment, c.Confidence)
		judge(&s, crit)
		if i, ok := stepIndex[level]; ok {
			rep.Steps[i] = s
		} else {
			stepIndex[level] = len(rep.Steps)
			rep.Steps = append(rep.Steps, s)
		}
		c.Progress.StepDone(info, &s)
		if err := ctx.Err(); err != nil {
			return Judgement{}, err
		}
		return verdictOf(&s), nil
	}
	return Execute(ctx, c.plan(), judgeFn)
}

// targetReady asks the target whether it can serve: vLLM's and the sim's
// /health, else a gateway's /readyz. A target with neither is taken as
// ready; one that does not answer is not.
func targetReady(ctx context.Context, c *http.Client, base string) bool {
	for _, path := range []string{"/health", "/readyz"} {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			cancel()
			return true
		}
		resp, err := c.Do(req)
		if err != nil {
			cancel()
			return false
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusNotFound {
			return resp.StatusCode == http.StatusOK
		}
	}
	return true
}

// waitIdle waits, up to limit, for the target to be ready (its /health
// answers, as it does not while a server restarts after an out-of-memory
// error) and idle (its metrics show nothing running or waiting), so one
// step's tail or crash does not load the next.
func waitIdle(ctx context.Context, clock Clock, scrape func(context.Context) (MetricsSample, error), ready func(context.Context) bool, limit time.Duration) {
	deadline := clock.Now().Add(limit)
	for {
		idle := ready(ctx)
		if idle && scrape != nil {
			s, err := scrape(ctx)
			idle = err != nil || ((!s.HasHealthy || s.Healthy) &&
				(!s.HasRunning || !s.HasWaiting || s.Running+s.Waiting == 0))
		}
		if idle || !clock.Now().Before(deadline) {
			return
		}
		select {
		case <-clock.After(50 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}
