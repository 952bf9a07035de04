package loadtest

import (
	"fmt"
	"sort"
	"time"
)

// Counts are the requests of a step by outcome. Warm-up requests are only
// counted in Warmup; every other field covers counted requests.
type Counts struct {
	Sent   int `json:"sent"`
	Warmup int `json:"warmup"`
	// Warm-up requests are in no figure, but their failures count against
	// the step: WarmupOverflow ran out of memory, WarmupFailed failed
	// otherwise (5xx, 4xx, timeout, lost connection).
	WarmupOverflow int `json:"warmup_overflow"`
	WarmupFailed   int `json:"warmup_failed"`
	OK             int `json:"ok"`
	Shed           int `json:"shed_429"`
	Client4xx      int `json:"client_4xx"`
	Server5xx      int `json:"server_5xx"`
	Overflow       int `json:"overflow"`
	ConnError      int `json:"conn_error"`
	Timeout        int `json:"timeout"`
	Incomplete     int `json:"incomplete"`
	Dropped        int `json:"dropped"`
}

// Failed is every counted request that reached the server and did not get a
// complete answer, shedding aside.
func (c Counts) Failed() int {
	return c.Client4xx + c.Server5xx + c.Overflow + c.ConnError + c.Timeout
}

// SLOResult is the share of requests that met every SLO, with its interval.
type SLOResult struct {
	TTFTMs float64 `json:"ttft_ms,omitempty"` // the SLOs judged against
	E2EMs  float64 `json:"e2e_ms,omitempty"`
	// Met of Judged requests met every SLO; Judged is every counted request
	// that reached the server and was not shed (a failed request misses).
	Met        int     `json:"met"`
	Judged     int     `json:"judged"`
	Attainment float64 `json:"attainment"`
	// Target attainment and the Wilson interval at Confidence: each bound is
	// a one-sided bound at that confidence.
	Target     float64 `json:"target"`
	Confidence float64 `json:"confidence"`
	Low        float64 `json:"ci_low"`
	High       float64 `json:"ci_high"`
	Verdict    string  `json:"verdict"` // "pass", "fail" or "inconclusive"
}

// KVReport is the memory curve of a step from the target's /metrics.
type KVReport struct {
	Source string `json:"source"` // metrics URL
	Series string `json:"series"` // which usage series was read
	// PeakUsage is the highest KV-cache usage seen (0–1): the highest
	// scrape, or the server's own exact peak when it reports one that rose
	// during the step (kvsim_kv_usage_peak_ratio).
	PeakUsage   float64 `json:"peak_usage"`
	MeanUsage   float64 `json:"mean_usage"`
	Preemptions float64 `json:"preemptions"` // increase during the step
	OOMEvents   float64 `json:"oom_events"`  // kvsim_oom_events_total increase
	PeakRunning float64 `json:"peak_running"`
	PeakWaiting float64 `json:"peak_waiting"`
	Scrapes     int     `json:"scrapes"`
	ScrapeFails int     `json:"scrape_errors"`
	LastError   string  `json:"last_scrape_error,omitempty"`
	NumGPUBlock int     `json:"num_gpu_blocks,omitempty"`
	BlockSize   int     `json:"block_size,omitempty"`
	// Curve is every scrape: seconds since the step began, usage, running,
	// waiting, and the preemption counter.
	Curve []CurvePoint `json:"curve"`
}

// CurvePoint is one scrape of a step's memory curve.
type CurvePoint struct {
	T           float64 `json:"t_s"`
	KVUsage     float64 `json:"kv_usage"`
	Running     float64 `json:"running"`
	Waiting     float64 `json:"waiting"`
	Preemptions float64 `json:"preemptions_total"`
}

// ErrorSample is one distinct error message and how often it was seen.
type ErrorSample struct {
	Outcome string `json:"outcome"`
	Message string `json:"message"`
	Count   int    `json:"count"`
}

// levelAgg pools every attempt at one level: a re-run adds evidence.
type levelAgg struct {
	mode    Mode
	level   float64
	target  string
	started time.Time

	attempts       int
	counts         Counts
	ttft, itl, e2e []float64 // milliseconds
	tpot           []float64
	outTokens      int
	promptTokens   int
	// tputOK and tputTokens are what the server answered inside the measured
	// windows, warm-up requests that finished there included.
	tputOK, tputTokens int
	tputPrompt         int // prompt tokens of the same requests
	window, wall       time.Duration
	met, judged        int
	stopped            string
	saturation         *SaturationVerdict
	errs               map[[2]string]int
	errOrder           [][2]string

	kvSource                 string
	kvSeries                 string
	hasKV                    bool
	kvPeak, kvSum            float64
	kvN                      int
	preempt, oom             float64
	peakRunning, peakWaiting float64
	scrapes, scrapeFails     int
	lastScrapeErr            string
	numBlocks, blockSize     int
	curve                    []CurvePoint
}

// sloLimits are the SLOs a request is held to; zero means none.
type sloLimits struct{ ttft, e2e time.Duration }

func (s sloLimits) any() bool { return s.ttft > 0 || s.e2e > 0 }

func (s sloLimits) met(r *Result) bool {
	if r.Outcome != OutcomeOK {
		return false
	}
	if s.ttft > 0 && r.TTFT() > s.ttft {
		return false
	}
	return s.e2e <= 0 || r.E2E() <= s.e2e
}

func (g *levelAgg) add(a attempt, slo sloLimits, metricsURL string) {
	if g.attempts == 0 {
		g.started = a.wallStart
	}
	g.attempts++
	g.counts.Warmup += a.warmup
	for i := range a.warmupFailed {
		r := &a.warmupFailed[i]
		if r.Outcome == OutcomeOverflow {
			g.counts.WarmupOverflow++
		} else {
			g.counts.WarmupFailed++
		}
		g.noteError(r, "warm-up ")
	}
	g.wall += a.wallEnd.Sub(a.wallStart)
	// The window closes with the last counted request that reached an
	// answer; one cut with the step says nothing about the server.
	var end time.Time
	for i := range a.results {
		if o := a.results[i].Outcome; o != OutcomeIncomplete && o != OutcomeDropped && a.results[i].End.After(end) {
			end = a.results[i].End
		}
	}
	if !a.measureStart.IsZero() && end.After(a.measureStart) {
		g.window += end.Sub(a.measureStart)
		for _, w := range a.warmupOK {
			if w.end.After(a.measureStart) && !w.end.After(end) {
				g.tputOK++
				g.tputTokens += w.outputTokens
				g.tputPrompt += w.promptTokens
			}
		}
	}
	if a.stopped != "" && g.stopped == "" {
		g.stopped = a.stopped
	}
	if a.saturation != nil && g.saturation == nil {
		g.saturation = a.saturation
	}
	for i := range a.results {
		r := &a.results[i]
		g.counts.Sent++
		switch r.Outcome {
		case OutcomeOK:
			g.counts.OK++
			g.tputOK++
			g.outTokens += r.OutputTokens
			g.tputTokens += r.OutputTokens
			g.tputPrompt += r.PromptTokens
			g.promptTokens += r.PromptTokens
			if !r.FirstToken.IsZero() {
				g.ttft = append(g.ttft, ms(r.TTFT()))
			}
			g.e2e = append(g.e2e, ms(r.E2E()))
			for _, d := range r.ITL {
				g.itl = append(g.itl, ms(d))
			}
			if r.OutputTokens > 1 && !r.FirstToken.IsZero() {
				g.tpot = append(g.tpot, ms(r.End.Sub(r.FirstToken))/float64(r.OutputTokens-1))
			}
		case OutcomeShed:
			g.counts.Shed++
		case OutcomeClientError:
			g.counts.Client4xx++
		case OutcomeServerError:
			g.counts.Server5xx++
		case OutcomeOverflow:
			g.counts.Overflow++
		case OutcomeConnError:
			g.counts.ConnError++
		case OutcomeTimeout:
			g.counts.Timeout++
		case OutcomeIncomplete:
			g.counts.Incomplete++
		case OutcomeDropped:
			g.counts.Dropped++
		}
		switch r.Outcome {
		case OutcomeShed, OutcomeIncomplete, OutcomeDropped:
		default:
			g.judged++
			if slo.met(r) {
				g.met++
			}
		}
		g.noteError(r, "")
	}

	// The memory curve.
	g.scrapes += a.scrapeAttempts
	g.scrapeFails += a.scrapeErrors
	if a.lastScrapeErr != "" {
		g.lastScrapeErr = a.lastScrapeErr
	}
	g.kvSource = metricsURL
	samples := make([]MetricsSample, 0, len(a.series)+2)
	if a.hasBefore {
		samples = append(samples, a.before)
	}
	samples = append(samples, a.series...)
	if a.hasAfter {
		samples = append(samples, a.after)
	}
	offset := g.wall - a.wallEnd.Sub(a.wallStart) // curve time runs on across attempts
	for i, s := range samples {
		if s.NumGPUBlocks > 0 {
			g.numBlocks, g.blockSize = s.NumGPUBlocks, s.BlockSize
		}
		at := s.At
		switch {
		case a.hasBefore && i == 0:
			at = a.wallStart
		case a.hasAfter && i == len(samples)-1:
			at = a.wallEnd
		}
		if !s.HasKV {
			continue
		}
		g.hasKV, g.kvSeries = true, s.KVSource
		// The baseline scrape before load is not part of the step's peak:
		// it shows what the previous step left behind.
		if !(a.hasBefore && i == 0) {
			g.kvPeak = max(g.kvPeak, s.KVUsage)
			g.kvSum += s.KVUsage
			g.kvN++
			g.peakRunning = max(g.peakRunning, s.Running)
			g.peakWaiting = max(g.peakWaiting, s.Waiting)
		}
		g.curve = append(g.curve, CurvePoint{
			T: (offset + at.Sub(a.wallStart)).Seconds(), KVUsage: s.KVUsage,
			Running: s.Running, Waiting: s.Waiting, Preemptions: s.Preemptions,
		})
	}
	if a.hasBefore && a.hasAfter {
		if a.before.HasPreemptions && a.after.HasPreemptions {
			g.preempt += counterDelta(a.before.Preemptions, a.after.Preemptions)
		}
		if a.before.HasOOM && a.after.HasOOM {
			g.oom += counterDelta(a.before.OOMEvents, a.after.OOMEvents)
		}
		// A server that reports its exact peak catches what a 1 s scrape
		// misses; it is a high-water mark, so only a rise belongs to us.
		if a.before.HasKVPeak && a.after.HasKVPeak && a.after.KVPeak > a.before.KVPeak {
			g.kvPeak = max(g.kvPeak, a.after.KVPeak)
		}
	}
}

// noteError keeps a failed request's message for the report's samples.
func (g *levelAgg) noteError(r *Result, prefix string) {
	if r.Outcome == OutcomeOK || r.Outcome == OutcomeIncomplete || r.Err == "" {
		return
	}
	if g.errs == nil {
		g.errs = map[[2]string]int{}
	}
	k := [2]string{prefix + r.Outcome.String(), r.Err}
	if _, seen := g.errs[k]; !seen {
		g.errOrder = append(g.errOrder, k)
	}
	g.errs[k]++
}

// counterDelta is a counter's increase; a reset (server restart) counts from 0.
func counterDelta(before, after float64) float64 {
	if after < before {
		return after
	}
	return after - before
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// StepReport is one level's figures and verdict, pooled over its attempts.
type StepReport struct {
	Target      string    `json:"target"`
	Mode        Mode      `json:"mode"`
	Level       float64   `json:"level"`
	Concurrency int       `json:"concurrency,omitempty"`
	Rate        float64   `json:"rate,omitempty"`
	Attempts    int       `json:"attempts"`
	StartedAt   time.Time `json:"started_at"`
	// WindowS is the measured time (first counted request sent to last
	// counted request finished), the denominator of every throughput.
	WindowS float64 `json:"window_s"`
	WallS   float64 `json:"wall_s"`

	Requests         Counts  `json:"requests"`
	RequestsPerS     float64 `json:"requests_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// TotalTokensPerS counts prompt and output tokens, as vLLM's
	// benchmark_serving and guidellm report total token throughput.
	TotalTokensPerS  float64 `json:"total_tokens_per_s"`
	MeanPromptTokens float64 `json:"mean_prompt_tokens"`
	MeanOutputTokens float64 `json:"mean_output_tokens"`

	TTFT Summary `json:"ttft_ms"`
	ITL  Summary `json:"itl_ms"`
	TPOT Summary `json:"tpot_ms"`
	E2E  Summary `json:"e2e_ms"`

	SLO        *SLOResult         `json:"slo"`
	KV         *KVReport          `json:"kv"`
	Saturation *SaturationVerdict `json:"saturation"`
	// Cost is the step's at its target's price; nil when not priced.
	Cost *Cost `json:"cost,omitempty"`

	StoppedEarly string `json:"stopped_early,omitempty"`
	// Verdict is "safe", "unsafe" or "inconclusive"; Reasons say why it is
	// not safe, Notes what the verdict could not see.
	Verdict string        `json:"verdict"`
	Safe    bool          `json:"safe"`
	Reasons []string      `json:"reasons"`
	Notes   []string      `json:"notes,omitempty"`
	Errors  []ErrorSample `json:"error_samples,omitempty"`
}

// report summarises the pooled attempts; the verdict is filled by judge.
func (g *levelAgg) report(slo sloLimits, target, confidence float64) StepReport {
	s := StepReport{
		Target: g.target, Mode: g.mode, Level: g.level, Attempts: g.attempts, StartedAt: g.started,
		WindowS: g.window.Seconds(), WallS: g.wall.Seconds(), Requests: g.counts,
		RequestsPerS:     Rate(float64(g.tputOK), g.window),
		OutputTokensPerS: Rate(float64(g.tputTokens), g.window),
		TotalTokensPerS:  Rate(float64(g.tputTokens+g.tputPrompt), g.window),
		TTFT:             Summarize(g.ttft), ITL: Summarize(g.itl), TPOT: Summarize(g.tpot), E2E: Summarize(g.e2e),
		StoppedEarly: g.stopped, Saturation: g.saturation, Reasons: []string{},
	}
	if g.mode == ModeRate {
		s.Rate = g.level
	} else {
		s.Concurrency = int(g.level)
	}
	if g.counts.OK > 0 {
		s.MeanPromptTokens = float64(g.promptTokens) / float64(g.counts.OK)
		s.MeanOutputTokens = float64(g.outTokens) / float64(g.counts.OK)
	}
	if slo.any() {
		z := NormalQuantile(confidence)
		lo, hi := Wilson(g.met, g.judged, z)
		r := &SLOResult{
			TTFTMs: ms(slo.ttft), E2EMs: ms(slo.e2e), Met: g.met, Judged: g.judged,
			Target: target, Confidence: confidence, Low: lo, High: hi,
		}
		if g.judged > 0 {
			r.Attainment = float64(g.met) / float64(g.judged)
		}
		switch {
		case lo >= target:
			r.Verdict = "pass"
		case hi < target:
			r.Verdict = "fail"
		default:
			r.Verdict = "inconclusive"
		}
		s.SLO = r
	}
	if g.hasKV || g.scrapes > 0 {
		kv := &KVReport{
			Source: g.kvSource, Series: g.kvSeries, PeakUsage: g.kvPeak, Preemptions: g.preempt, OOMEvents: g.oom,
			PeakRunning: g.peakRunning, PeakWaiting: g.peakWaiting, Scrapes: g.scrapes, ScrapeFails: g.scrapeFails,
			LastError: g.lastScrapeErr, NumGPUBlock: g.numBlocks, BlockSize: g.blockSize, Curve: g.curve,
		}
		if kv.Curve == nil {
			kv.Curve = []CurvePoint{}
		}
		if g.kvN > 0 {
			kv.MeanUsage = g.kvSum / float64(g.kvN)
		}
		if g.hasKV {
			s.KV = kv
		} else {
			s.KV = nil
			s.Notes = append(s.Notes, fmt.Sprintf("KV usage not measured: %d scrapes of %s, none with %s or %s (last error: %s)",
				g.scrapes, g.kvSource, metricKVUsage, metricGPUCache, orNone(g.lastScrapeErr)))
		}
	} else {
		s.Notes = append(s.Notes, "KV usage not measured: no metrics URL")
	}
	keys := append([][2]string(nil), g.errOrder...)
	sort.SliceStable(keys, func(i, j int) bool { return g.errs[keys[i]] > g.errs[keys[j]] })
	for i, k := range keys {
		if i == 5 {
			break
		}
		s.Errors = append(s.Errors, ErrorSample{Outcome: k[0], Message: k[1], Count: g.errs[k]})
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
