package loadtest

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is how load is offered.
type Mode string

const (
	// ModeConcurrency is a closed loop: N workers, each sending its next
	// request when its last one ends.
	ModeConcurrency Mode = "concurrency"
	// ModeRate is an open loop: Poisson arrivals at a rate, sent whether
	// or not earlier ones have finished.
	ModeRate Mode = "rate"
)

// stepConfig is one attempt at one level.
type stepConfig struct {
	Mode  Mode
	Level float64
	// Requests counted; 0 means as many as fit in Duration.
	Requests int
	// Duration of the counted part; 0 means until Requests are done.
	Duration time.Duration
	// Warmup requests run first and are not counted.
	Warmup int
	// MaxStepTime cuts the attempt, whatever else; in-flight requests end
	// as OutcomeIncomplete. 0 means no cut (Requests or Duration must bound
	// it then, with each request bounded by its own timeout).
	MaxStepTime time.Duration
	// MaxInFlight bounds an open loop's concurrent requests.
	MaxInFlight int
	// Saturation enables the over-saturation stop; nil disables it.
	Saturation *SaturationConfig
	// Turns, above 1, makes each closed-loop worker hold sessions of that
	// many requests (see session).
	Turns int
	// Opening makes a session's first turn (nil: the workload does).
	Opening func(i int) RequestSpec
	// Think is the mean pause before a session's later turn, drawn
	// uniformly between half and one and a half of it; 0 none.
	Think time.Duration
	// SharedTokens is the length of the shared prefix every spec opens with;
	// MaxContext the model's context (0 unknown), past which a session
	// starts afresh.
	SharedTokens, MaxContext int
	// ArrivalSeed seeds the Poisson arrivals and the think times.
	ArrivalSeed uint64
	// Scrape reads the target's metrics; nil when there are none.
	Scrape         func(ctx context.Context) (MetricsSample, error)
	ScrapeInterval time.Duration
	// Progress, if set, is called every ProgressInterval with the counters.
	Progress         func(ProgressSnapshot)
	ProgressInterval time.Duration
}

// ProgressSnapshot is the live state of a running attempt.
type ProgressSnapshot struct {
	Elapsed  time.Duration
	Sent     int // counted requests sent so far
	Done     int // counted requests finished
	OK       int
	Failed   int // finished, not OK and not shed
	Shed     int
	InFlight int
	Total    int           // counted requests planned; 0 when bounded by time
	Duration time.Duration // counted time planned; 0 when bounded by count
	KVUsage  float64
	HasKV    bool
}

// finished is when a request was answered and how many tokens it got.
type finished struct {
	end          time.Time
	outputTokens int
	promptTokens int
}

// attempt is what one attempt at one level produced.
type attempt struct {
	results      []Result // counted requests only, in completion order
	warmup       int
	warmupFailed []Result // warm-up requests that failed, kept for the verdict
	// warmupOK are the warm-up requests answered in full: not measured, but
	// the server's work all the same, and counted in the throughput when
	// they finish inside the measured window.
	warmupOK     []finished
	measureStart time.Time // first counted request sent
	wallStart    time.Time
	wallEnd      time.Time
	stopped      string // why it was cut short, "" when it ran its course
	saturation   *SaturationVerdict

	before, after  MetricsSample
	hasBefore      bool
	hasAfter       bool
	series         []MetricsSample
	scrapeErrors   int
	lastScrapeErr  string
	scrapeAttempts int
}

// Reasons a step stops early.
const (
	stopSaturated   = "over-saturated"
	stopMaxStepTime = "max step time"
	stopInterrupted = "interrupted"
)

// runner is the shared state of one attempt. mu guards everything below it;
// the counters are atomics so the progress ticker reads them lock-free.
type runner struct {
	cfg      stepConfig
	clock    Clock
	sender   Sender
	workload func(i int) RequestSpec

	stopOnce sync.Once
	stopCh   chan struct{}
	cancel   context.CancelFunc

	sent, done, ok, failed, shed, inflight atomic.Int64

	mu         sync.Mutex
	a          attempt
	measuring  bool
	detector   *SaturationDetector
	kv         float64
	hasKV      bool
	stoppedWhy string
}

// runAttempt runs one attempt. It returns when every request it sent has
// ended; with MaxStepTime set that is at most MaxStepTime after it began.
func runAttempt(ctx context.Context, clock Clock, sender Sender, workload func(int) RequestSpec, cfg stepConfig) attempt {
	r := &runner{cfg: cfg, clock: clock, sender: sender, workload: workload, stopCh: make(chan struct{})}
	if cfg.Scrape != nil {
		r.a.scrapeAttempts++
		if s, err := cfg.Scrape(ctx); err == nil {
			r.a.before, r.a.hasBefore = s, true
		} else {
			r.scrapeFailed(err)
		}
	}
	reqCtx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	defer cancel()
	r.a.wallStart = clock.Now()
	if cfg.Saturation != nil {
		r.detector = NewSaturationDetector(*cfg.Saturation, r.a.wallStart)
	}

	bg := make(chan struct{})
	var bgWG sync.WaitGroup
	r.background(ctx, bg, &bgWG)

	switch cfg.Mode {
	case ModeRate:
		r.openLoop(reqCtx)
	default:
		r.closedLoop(reqCtx)
	}
	close(bg)
	bgWG.Wait()

	r.a.wallEnd = clock.Now()
	if ctx.Err() != nil && r.stoppedWhy == "" {
		r.stoppedWhy = stopInterrupted
	}
	r.a.stopped = r.stoppedWhy
	if cfg.Scrape != nil {
		r.a.scrapeAttempts++
		if s, err := cfg.Scrape(context.WithoutCancel(ctx)); err == nil {
			r.a.after, r.a.hasAfter = s, true
		} else {
			r.scrapeFailed(err)
		}
	}
	if cfg.Progress != nil {
		cfg.Progress(r.snapshot(r.a.wallEnd))
	}
	return r.a
}

func (r *runner) stop(why string) {
	r.stopOnce.Do(func() {
		r.mu.Lock()
		r.stoppedWhy = why
		r.mu.Unlock()
		close(r.stopCh)
		r.cancel()
	})
}

func (r *runner) stopping(ctx context.Context) bool {
	select {
	case <-r.stopCh:
		return true
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// admit decides whether request i may be sent now, starting the measured
// window at the first counted one.
func (r *runner) admit(i int, now time.Time) bool {
	if r.cfg.Requests > 0 && i >= r.cfg.Warmup+r.cfg.Requests {
		return false
	}
	if i < r.cfg.Warmup {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.measuring {
		r.measuring, r.a.measureStart = true, now
	}
	if r.cfg.Duration > 0 && !now.Before(r.a.measureStart.Add(r.cfg.Duration)) {
		return false
	}
	r.sent.Add(1)
	return true
}

// beyond reports, without side effects, whether request i at time at is
// past the attempt's count or its measured window.
func (r *runner) beyond(i int, at time.Time) bool {
	if r.cfg.Requests > 0 && i >= r.cfg.Warmup+r.cfg.Requests {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.measuring && r.cfg.Duration > 0 && !at.Before(r.a.measureStart.Add(r.cfg.Duration))
}

func (r *runner) closedLoop(ctx context.Context) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for worker := range int(r.cfg.Level) {
		think := rand.New(rand.NewPCG(r.cfg.ArrivalSeed, uint64(worker)))
		wg.Go(func() {
			var s session
			for !r.stopping(ctx) {
				i := int(next.Add(1) - 1)
				if !r.admit(i, r.clock.Now()) {
					return
				}
				var spec RequestSpec
				if r.cfg.Turns > 1 && len(s.history) == 0 && r.cfg.Opening != nil {
					spec = r.cfg.Opening(i)
				} else {
					spec = r.workload(i)
				}
				if r.cfg.Turns > 1 {
					s.open(&spec, r.cfg.MaxContext)
				}
				r.inflight.Add(1)
				res := r.sender.Send(ctx, spec)
				r.inflight.Add(-1)
				if r.cfg.Turns > 1 {
					s.close(spec, &res, r.cfg.Turns, r.cfg.SharedTokens)
				}
				r.record(i, res)
				if r.cfg.Think > 0 && len(s.history) > 0 {
					r.pause(ctx, time.Duration((0.5+think.Float64())*float64(r.cfg.Think)))
				}
			}
		})
	}
	wg.Wait()
}

// pause waits d, or until the step stops.
func (r *runner) pause(ctx context.Context, d time.Duration) {
	select {
	case <-r.clock.After(d):
	case <-r.stopCh:
	case <-ctx.Done():
	}
}

// session is one closed-loop worker's conversation: the turns it has had
// and how many tokens they add to the next request's prompt.
type session struct {
	history []Turn
	tokens  int
}

// open makes spec the session's next turn: its history is sent before the
// new user message. A session whose next turn would not fit maxContext (0:
// unknown) starts afresh.
func (s *session) open(spec *RequestSpec, maxContext int) {
	if maxContext > 0 && spec.PromptTokens+s.tokens+spec.MaxTokens > maxContext {
		*s = session{}
	}
	spec.History = s.history
	spec.PromptTokens += s.tokens
	spec.KeepText = true
}

// close files the answer to spec. The session ends after turns requests,
// or at the first one not answered in full. The text is dropped from res: a
// step keeps every result, and only the session needs it.
func (s *session) close(spec RequestSpec, res *Result, turns, shared int) {
	if res.Outcome != OutcomeOK || len(s.history)+1 >= turns {
		*s = session{}
		res.Text = ""
		return
	}
	// The next turn re-sends all of this one's prompt (res.PromptTokens is
	// the server's count, else the spec's) but the shared prefix, which its
	// own spec counts again, and this answer.
	s.tokens = max(res.PromptTokens+res.OutputTokens-shared, 0)
	s.history = append(s.history[:len(s.history):len(s.history)], Turn{User: spec.Prompt, Assistant: res.Text})
	res.Text = ""
}

func (r *runner) openLoop(ctx context.Context) {
	arrivals := NewPoisson(r.cfg.Level, rand.New(rand.NewPCG(r.cfg.ArrivalSeed, math.Float64bits(r.cfg.Level))))
	maxIn := int64(r.cfg.MaxInFlight)
	if maxIn <= 0 {
		maxIn = 10_000
	}
	start := r.a.wallStart
	var wg sync.WaitGroup
	for i := 0; ; i++ {
		at := start.Add(arrivals.Next())
		if r.beyond(i, at) {
			break // no need to wait for an arrival that will not be sent
		}
		if d := at.Sub(r.clock.Now()); d > 0 {
			select {
			case <-r.clock.After(d):
			case <-r.stopCh:
			case <-ctx.Done():
			}
		}
		if r.stopping(ctx) || !r.admit(i, at) {
			break
		}
		if r.inflight.Load() >= maxIn {
			now := r.clock.Now()
			r.record(i, Result{Index: i, Outcome: OutcomeDropped, Start: now, End: now,
				Err: "client at its in-flight limit; arrival not sent"})
			continue
		}
		spec := r.workload(i)
		r.inflight.Add(1)
		wg.Go(func() {
			res := r.sender.Send(ctx, spec)
			r.inflight.Add(-1)
			r.record(i, res)
		})
	}
	wg.Wait()
}

// record files one finished request.
func (r *runner) record(i int, res Result) {
	if i < r.cfg.Warmup {
		r.mu.Lock()
		r.a.warmup++
		// Not measured, but not forgiven: a warm-up request that overflows
		// or fails says the level is unsafe as loudly as a counted one.
		switch res.Outcome {
		case OutcomeOK:
			r.a.warmupOK = append(r.a.warmupOK, finished{end: res.End, outputTokens: res.OutputTokens, promptTokens: res.PromptTokens})
		case OutcomeShed, OutcomeIncomplete, OutcomeDropped:
		default:
			r.a.warmupFailed = append(r.a.warmupFailed, res)
		}
		r.mu.Unlock()
		return
	}
	switch res.Outcome {
	case OutcomeOK:
		r.ok.Add(1)
	case OutcomeShed:
		r.shed.Add(1)
	case OutcomeIncomplete, OutcomeDropped:
	default:
		r.failed.Add(1)
	}
	r.done.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.a.results = append(r.a.results, res)
	if r.detector != nil && res.Outcome == OutcomeOK {
		if !res.FirstToken.IsZero() {
			r.detector.ObserveTTFT(res.FirstToken, res.TTFT())
		}
		r.detector.ObserveCompletion(res.End)
	}
}

func (r *runner) scrapeFailed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.a.scrapeErrors++
	r.a.lastScrapeErr = err.Error()
}

// background runs the metrics scrape, the saturation check, the step-time
// cut and the progress ticker until bg closes.
func (r *runner) background(ctx context.Context, bg chan struct{}, wg *sync.WaitGroup) {
	every := func(d time.Duration, f func(now time.Time)) {
		wg.Go(func() {
			for {
				select {
				case now := <-r.clock.After(d):
					f(now)
				case <-bg:
					return
				case <-ctx.Done():
					return
				}
			}
		})
	}
	if r.cfg.Scrape != nil && r.cfg.ScrapeInterval > 0 {
		every(r.cfg.ScrapeInterval, func(now time.Time) {
			r.mu.Lock()
			r.a.scrapeAttempts++
			r.mu.Unlock()
			s, err := r.cfg.Scrape(ctx)
			if err != nil {
				r.scrapeFailed(err)
				return
			}
			s.At = now
			r.mu.Lock()
			r.a.series = append(r.a.series, s)
			if s.HasKV {
				r.kv, r.hasKV = s.KVUsage, true
			}
			r.mu.Unlock()
		})
	}
	if r.detector != nil {
		every(time.Second, func(now time.Time) {
			r.mu.Lock()
			v := r.detector.Check(now)
			if v.Saturated && r.a.saturation == nil {
				r.a.saturation = &v
			}
			r.mu.Unlock()
			if v.Saturated {
				r.stop(stopSaturated)
			}
		})
	}
	if r.cfg.MaxStepTime > 0 {
		wg.Go(func() {
			select {
			case <-r.clock.After(r.cfg.MaxStepTime):
				r.stop(stopMaxStepTime)
			case <-bg:
			case <-ctx.Done():
			}
		})
	}
	if r.cfg.Progress != nil {
		iv := r.cfg.ProgressInterval
		if iv <= 0 {
			iv = time.Second
		}
		every(iv, func(now time.Time) { r.cfg.Progress(r.snapshot(now)) })
	}
}

func (r *runner) snapshot(now time.Time) ProgressSnapshot {
	r.mu.Lock()
	kv, hasKV := r.kv, r.hasKV
	r.mu.Unlock()
	return ProgressSnapshot{
		Elapsed: now.Sub(r.a.wallStart),
		Sent:    int(r.sent.Load()), Done: int(r.done.Load()),
		OK: int(r.ok.Load()), Failed: int(r.failed.Load()), Shed: int(r.shed.Load()),
		InFlight: int(r.inflight.Load()), Total: r.cfg.Requests, Duration: r.cfg.Duration,
		KVUsage: kv, HasKV: hasKV,
	}
}
