package loadtest

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeSender answers from a script. It records when each request was sent
// (by its clock) and the most requests it ever held at once.
type fakeSender struct {
	clock    Clock
	hold     func(i int) bool // true: wait for the context (a request that never ends)
	result   func(i int, start time.Time) Result
	onSend   chan int // if set, told about each send after it is recorded
	barrier  int      // the first barrier sends wait until that many are in flight
	mu       sync.Mutex
	sent     map[int]time.Time
	inflight atomic.Int64
	maxSeen  atomic.Int64
	arrived  sync.WaitGroup
	once     sync.Once
}

func (f *fakeSender) Send(ctx context.Context, spec RequestSpec) Result {
	now := f.clock.Now()
	f.mu.Lock()
	if f.sent == nil {
		f.sent = map[int]time.Time{}
	}
	f.sent[spec.Index] = now
	f.mu.Unlock()
	n := f.inflight.Add(1)
	defer f.inflight.Add(-1)
	for {
		m := f.maxSeen.Load()
		if n <= m || f.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	if f.barrier > 0 {
		f.once.Do(func() { f.arrived.Add(f.barrier) })
		if spec.Index < f.barrier {
			f.arrived.Done()
			f.arrived.Wait()
		}
	}
	if f.onSend != nil {
		f.onSend <- spec.Index
	}
	if f.hold != nil && f.hold(spec.Index) {
		<-ctx.Done()
		return Result{Index: spec.Index, Outcome: OutcomeIncomplete, Start: now, End: f.clock.Now()}
	}
	if f.result != nil {
		return f.result(spec.Index, now)
	}
	return Result{Index: spec.Index, Outcome: OutcomeOK, Start: now, FirstToken: now, End: now, OutputTokens: 1}
}

func specOf(i int) RequestSpec {
	return RequestSpec{Index: i, Prompt: "p", PromptTokens: 1, MaxTokens: 1}
}

func TestClosedLoopCountsAndConcurrency(t *testing.T) {
	f := &fakeSender{clock: SystemClock{}, barrier: 4}
	a := runAttempt(context.Background(), SystemClock{}, f, specOf, stepConfig{Mode: ModeConcurrency, Level: 4, Requests: 30, Warmup: 4})
	if len(a.results) != 30 || a.warmup != 4 {
		t.Errorf("%d counted, %d warm-up; want 30 and 4", len(a.results), a.warmup)
	}
	if len(f.sent) != 34 {
		t.Errorf("%d sent, want 34", len(f.sent))
	}
	for _, r := range a.results {
		if r.Index < 4 {
			t.Errorf("warm-up request %d was counted", r.Index)
		}
	}
	// The barrier proves four were in flight at once; never more.
	if m := f.maxSeen.Load(); m != 4 {
		t.Errorf("most in flight %d, want exactly 4", m)
	}
	if a.stopped != "" || a.measureStart.IsZero() {
		t.Errorf("stopped %q, measure start %v", a.stopped, a.measureStart)
	}
}

func TestAdmit(t *testing.T) {
	r := &runner{cfg: stepConfig{Requests: 5, Warmup: 2}}
	var admitted []int
	for i := range 10 {
		if r.admit(i, at(float64(i))) {
			admitted = append(admitted, i)
		}
	}
	if len(admitted) != 7 || admitted[6] != 6 || !r.a.measureStart.Equal(at(2)) || r.sent.Load() != 5 {
		t.Errorf("admitted %v, measure start %v, sent %d; want 0..6 from t=2s, 5 counted", admitted, r.a.measureStart, r.sent.Load())
	}
	// Duration-bound: the window opens at the first counted request and
	// closes Duration later; warm-up is not inside it.
	r = &runner{cfg: stepConfig{Duration: 10 * time.Second, Warmup: 1}}
	for _, tc := range []struct {
		i    int
		sec  float64
		want bool
	}{{0, 0, true}, {1, 5, true}, {2, 14.9, true}, {3, 15, false}, {4, 100, false}} {
		if got := r.admit(tc.i, at(tc.sec)); got != tc.want {
			t.Errorf("request %d at %gs: admit %v, want %v", tc.i, tc.sec, got, tc.want)
		}
	}
}

func TestOpenLoopScheduleIsExact(t *testing.T) {
	clock := newManualClock()
	f := &fakeSender{clock: clock, onSend: make(chan int)}
	cfg := stepConfig{Mode: ModeRate, Level: 2.5, Requests: 6, Warmup: 2, ArrivalSeed: 11}
	done := make(chan attempt)
	go func() { done <- runAttempt(context.Background(), clock, f, specOf, cfg) }()
	for range 8 {
		clock.waitWaiters(1)
		clock.advanceToNext()
		<-f.onSend // recorded at the arrival time, before the clock moves on
	}
	a := <-done
	// The same generator, stepped by hand, says when each should have gone.
	p := NewPoisson(2.5, rand.New(rand.NewPCG(11, math.Float64bits(2.5))))
	for i := range 8 {
		want := t0.Add(p.Next())
		if got := f.sent[i]; !got.Equal(want) {
			t.Errorf("request %d sent at %s, want %s", i, got.Sub(t0), want.Sub(t0))
		}
	}
	if len(a.results) != 6 || a.warmup != 2 {
		t.Errorf("%d counted %d warm-up", len(a.results), a.warmup)
	}
	if !a.measureStart.Equal(f.sent[2]) {
		t.Errorf("measured from %s, want the first counted arrival %s", a.measureStart.Sub(t0), f.sent[2].Sub(t0))
	}
}

func TestOpenLoopDropsAtTheInFlightLimit(t *testing.T) {
	clock := newManualClock()
	f := &fakeSender{clock: clock, onSend: make(chan int, 10), hold: func(int) bool { return true }}
	cfg := stepConfig{Mode: ModeRate, Level: 1, Requests: 10, MaxInFlight: 1, ArrivalSeed: 1}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan attempt)
	go func() { done <- runAttempt(ctx, clock, f, specOf, cfg) }()
	// Arrival 0 is held in flight; arrivals 1 and 2 find the client full.
	// The timer of arrival 3 shows that both were handled; then the run is
	// interrupted, which ends the held request.
	for range 3 {
		clock.waitWaiters(1)
		clock.advanceToNext()
	}
	<-f.onSend
	clock.waitWaiters(1)
	cancel()
	a := <-done
	counts := map[Outcome]int{}
	for _, r := range a.results {
		counts[r.Outcome]++
	}
	if counts[OutcomeDropped] != 2 || counts[OutcomeIncomplete] != 1 || len(a.results) != 3 || a.stopped != stopInterrupted {
		t.Errorf("outcomes %v stopped %q; want 2 dropped, 1 incomplete, interrupted", counts, a.stopped)
	}
}

func TestMaxStepTimeCutsInFlightRequests(t *testing.T) {
	clock := newManualClock()
	f := &fakeSender{clock: clock, onSend: make(chan int, 8), hold: func(i int) bool { return i >= 5 }}
	cfg := stepConfig{Mode: ModeConcurrency, Level: 2, Requests: 100, MaxStepTime: 10 * time.Minute}
	done := make(chan attempt)
	go func() { done <- runAttempt(context.Background(), clock, f, specOf, cfg) }()
	clock.waitWaiters(1) // the step-time cut
	for range 7 {
		<-f.onSend // 0..4 return at once; 5 and 6 hang
	}
	clock.advanceToNext()
	a := <-done
	if a.stopped != stopMaxStepTime {
		t.Fatalf("stopped %q", a.stopped)
	}
	var ok, incomplete int
	for _, r := range a.results {
		switch r.Outcome {
		case OutcomeOK:
			ok++
		case OutcomeIncomplete:
			incomplete++
		}
	}
	if ok != 5 || incomplete != 2 {
		t.Errorf("%d ok, %d incomplete; want 5 and 2", ok, incomplete)
	}
}

func TestSaturationStopsAStep(t *testing.T) {
	// One worker; request i starts at i·100ms (by its own timestamps) with a
	// TTFT that grows 0.2 s each second: a queue running away at a flat
	// 10 req/s. After 300 requests the sender hangs, leaving the check to
	// the detector's one-second ticker.
	clock := newManualClock()
	f := &fakeSender{clock: clock, hold: func(i int) bool { return i >= 300 },
		result: func(i int, _ time.Time) Result {
			x := float64(i) * 0.1
			start := at(x)
			ttft := time.Duration((0.2 + 0.2*x) * float64(time.Second))
			return Result{Index: i, Outcome: OutcomeOK, Start: start, FirstToken: start.Add(ttft), End: at(x + 0.09), OutputTokens: 5}
		}}
	cfg := stepConfig{Mode: ModeConcurrency, Level: 1, Requests: 1000, Saturation: &SaturationConfig{}}
	done := make(chan attempt)
	go func() { done <- runAttempt(context.Background(), clock, f, specOf, cfg) }()
	for f.inflight.Load() == 0 || len(f.sentSnapshot()) < 301 {
		time.Sleep(time.Millisecond) // wait for the worker to reach the hang
	}
	var a attempt
	for a.wallEnd.IsZero() {
		select {
		case a = <-done:
		default:
			// Tick the detector's clock while the step runs; once it has
			// stopped, its ticker may be gone, so never wait for one.
			if !clock.advanceIfWaiting() {
				time.Sleep(time.Millisecond)
			}
		}
	}
	if a.stopped != stopSaturated || a.saturation == nil || !a.saturation.Saturated {
		t.Fatalf("stopped %q, verdict %+v", a.stopped, a.saturation)
	}
	if el := clock.Now().Sub(t0); el > 40*time.Second {
		t.Errorf("stopped only after %s", el)
	}
}

func (f *fakeSender) sentSnapshot() map[int]time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[int]time.Time, len(f.sent))
	for k, v := range f.sent {
		out[k] = v
	}
	return out
}
