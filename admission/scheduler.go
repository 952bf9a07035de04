package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/admission/predict"
)

// forecastWork is what the forecasts use beside the GPUs' own: the fixed
// predictor of pinned requests, and working memory reused under the
// scheduler's mu, so that judging a candidate allocates nothing.
type forecastWork struct {
	scratch curve // a candidate's forecast
	// certain is the lengths of requests that set their own (Pinned):
	// every sequence runs to its cap, no sooner. It holds no sample, so
	// every sequence survives to its cap, and it learns none.
	certain *predict.Lengths
	// own is a candidate's forecast without its shareable blocks (share.go),
	// for GPUs that hold them once; ownSeq, ownLens and ownOpaque name whose.
	own       curve
	ownRuns   []int // the shared runs own was computed with
	ownSeq    uint64
	ownLens   *predict.Lengths
	ownOpaque bool
	// scratchSeq, scratchLens and scratchOpaque name whose forecast scratch
	// holds (0: none); see waiterCurveLocked.
	scratchSeq    uint64
	scratchLens   *predict.Lengths
	scratchOpaque bool
	freeCurves    []curve // released tickets' curve arrays, for reuse
}

// stopBook is the guard's account: trips by reason, requests stopped,
// Stoppers to call once mu is released, and a flag against re-entry.
type stopBook struct {
	trips      map[string]int64
	scopeTrips [scopeQueueIndex + 1]int64 // drift trips by scope (drift.go)
	guardStops int64
	pending    []Stopper
	inGuard    bool
}

// Scheduler admits requests to GPUs (their KV budgets) from queues (one per
// model): see the package documentation for its model.
//
// Locking: mu guards every field below it and the state of every GPU,
// queue, line, tenant, waiter and Ticket of the scheduler. It is a leaf lock
// except for the Clock: the scheduler calls Clock.AfterFunc and Timer.Stop
// with mu held, so a Clock must never call back into the scheduler while
// holding a lock of its own (timer functions run in their own goroutines and
// take mu themselves). Methods named ...Locked expect mu held. Observer
// callbacks and the waiters' own bookkeeping run after mu is released.
type Scheduler struct {
	clock    Clock    // fixed at New
	observer Observer // fixed at New; nil = none
	count    counters // atomics; no lock

	mu        sync.Mutex
	set       settings
	cacheView CacheView // nil: binding ignores what GPUs hold cached (cacheview.go)
	costs     []int64   // scratch of cacheCostsLocked, by GPU index
	runs      shareRuns // what a candidate's fits counted shared, by GPU (cacheview.go)
	gpus      []*gpu    // configured, in configuration order
	gpuByName map[string]*gpu
	// retired are GPUs a Reconfigure removed while tickets still held
	// weight in them, by name: a GPU configured again under its name is
	// the same GPU, so what its GPU still runs counts from the start.
	retired     map[string]*gpu
	queues      []*queue
	queueByName map[string]*queue
	tenants     map[string]*tenantState // includes "" (anon)
	anon        *tenantState
	queued      int    // waiters, all queues
	seq         uint64 // arrival order of requests, kept by a moved ticket
	pass        uint64 // dispatch pass counter
	sweepAt     int    // tenant map size that triggers sweepIdleTenantsLocked
	slab        []Ticket
	atOnce      int64 // admissions on the fast path (under mu, which it holds anyway)
	backfilled  int64 // waiters admitted past an earlier waiter that did not fit
	rng         *rand.Rand
	fw          forecastWork
	cursors     []*waiter // a dispatch pass's positions, one per queue
	// last is the latest admission, for the invariant checks.
	last struct {
		hold       *gpu // its GPU
		preemptive bool // it was a preemptive grant
	}
	preempt preemptBook // see preemption.go
	knobs   testingKnobs
	limits  limitState // see limit.go

	stops stopBook // the guard's account (guard.go)
}

// testingKnobs are hooks for this package's tests; zero in production.
type testingKnobs struct {
	// check runs with mu held after every change of state, named by op.
	check func(op string)
}

// Operation names passed to testingKnobs.check.
const (
	opAdmit       = "admit" // at once, on Acquire's fast path
	opGrant       = "grant" // a waiter, from a dispatch pass
	opDispatch    = "dispatch"
	opRelease     = "release"
	opShrink      = "shrink"
	opProgress    = "progress"
	opUngrant     = "ungrant" // a grant given back because the context ended at the same time
	opEnqueue     = "enqueue"
	opRefuse      = "refuse"
	opCancel      = "cancel"
	opResize      = "resize"
	opFeedback    = "feedback"
	opReconfigure = "reconfigure"
	opRoute       = "route"
	opUsage       = "usage"
	opMove        = "move"
	opPreempt     = "preempt" // a waiter may now start preemptively (preemption.go)
)

func (s *Scheduler) checkLocked(op string) {
	if s.knobs.check != nil {
		s.knobs.check(op)
	}
}

// New validates cfg and returns a scheduler with nothing held.
func New(cfg Config) (*Scheduler, error) {
	set, err := resolve(cfg)
	if err != nil {
		return nil, err
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = 0x6b76676174650a // any fixed value: jitter needs spread, not secrecy
	}
	s := &Scheduler{clock: cfg.Clock, observer: cfg.Observer, gpuByName: map[string]*gpu{},
		queueByName: map[string]*queue{}, tenants: map[string]*tenantState{}, stops: stopBook{trips: map[string]int64{}},
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	if s.clock == nil {
		s.clock = SystemClock()
	}
	if s.fw.certain, err = predict.NewLengths(predict.LengthsConfig{MaxLen: math.MaxInt32}); err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	s.limits.limited, s.limits.onDemand = cfg.Limited, cfg.OnDemand
	s.mu.Lock()
	s.applyLocked(set, s.clock.Now())
	s.mu.Unlock()
	return s, nil
}

// Acquire admits r at once if a GPU of its queue has room for it and
// nobody it must not pass is waiting, else queues it until it is admitted,
// refused, or ctx is done. A refusal is a *RejectError; a ctx that ends
// first gives an error wrapping ctx.Err(). Either way nothing stays held. An
// invalid request (unknown queue or class, a bad shape or weight) is a plain
// error.
func (s *Scheduler) Acquire(ctx context.Context, r Request) (*Ticket, error) {
	return s.acquire(ctx, r, nil)
}

// AcquireTicket is Acquire into a Ticket the caller owns (a field of its
// per-request state, say), so that an admission that fits at once allocates
// nothing beyond what its Shape needs. t must hold nothing: the zero
// Ticket, or one already released. Reusing a released Ticket starts a new
// admission in it, so the caller must make sure no stale Release of the old
// one can still run. On error t holds nothing.
func (s *Scheduler) AcquireTicket(ctx context.Context, r Request, t *Ticket) error {
	if t == nil {
		return errors.New("admission: AcquireTicket: nil ticket")
	}
	_, err := s.acquire(ctx, r, t)
	return err
}

func (s *Scheduler) acquire(ctx context.Context, r Request, into *Ticket) (*Ticket, error) {
	if len(r.Shape) > 0 && r.Weight != 0 {
		return nil, fmt.Errorf("admission: request with a shape must not set weight (%d)", r.Weight)
	}
	if len(r.Shape) == 0 && r.Weight <= 0 {
		return nil, fmt.Errorf("admission: weight %d: must be > 0", r.Weight)
	}
	for i, g := range r.Shape {
		if err := g.validate(i); err != nil {
			return nil, fmt.Errorf("admission: %w", err)
		}
	}
	s.mu.Lock()
	if into != nil && into.weight != 0 {
		held := into.weight
		s.mu.Unlock()
		return nil, fmt.Errorf("admission: AcquireTicket: the ticket still holds %d", held)
	}
	q := s.queueByName[r.Queue]
	if q == nil {
		names := s.queueNamesLocked()
		s.mu.Unlock()
		return nil, fmt.Errorf("admission: queue %q: unknown (have %s)", r.Queue, names)
	}
	l := q.lineLocked(s, r.Class)
	if l == nil {
		names := s.classNamesLocked()
		s.mu.Unlock()
		return nil, fmt.Errorf("admission: class %q: unknown (have %s)", r.Class, names)
	}
	var stackW waiter
	w := &stackW
	s.initWaiterLocked(w, q, l, r, into)
	// ctx ending has happened before the call: fail, as x/sync's semaphore
	// does, even if the weight is free. Err, not Done: a request admitted at
	// once never needs the channel, which a context may make on demand.
	if err := ctx.Err(); err != nil {
		s.mu.Unlock()
		return nil, s.canceledErr(err, w.event(0))
	}
	if reason, limit := s.refusalLocked(w); reason != nil {
		retry := time.Duration(0)
		if reason == ErrOverloaded {
			retry = s.retryLocked(s.clock.Now(), w, s.pressureNeedLocked(w))
		}
		return nil, s.rejectUnlock(reason, w, limit, retry)
	}
	if !q.anyAheadLocked(w) {
		s.expireLimitsLocked()
		if p, backfill := s.pickLocked(w); p != nil {
			tk := s.holdLocked(w, p, 0)
			s.atOnce++
			if backfill {
				s.backfilled++
			}
			if s.queued > 0 {
				// Its holding moves what waiters were judged by: a waiter of
				// its tenant may now be over its cap (and passed over), and
				// a head's expected start moves later, which may let those
				// behind it in.
				s.dispatchLocked()
			}
			s.checkLocked(opAdmit)
			s.mu.Unlock()
			if s.observer != nil {
				e := w.event(0)
				e.GPU, e.Backfilled = p.name, backfill
				s.observer.Admitted(e)
			}
			return tk, nil
		}
	}
	hw := new(waiter)
	*hw = *w
	return s.enqueue(ctx, hw, s.clock.Now())
}

// refusalLocked says why w must be refused at once, if it must: it could
// never fit any of its GPUs (ErrTooLarge, ErrTenantQuota), none of them is
// available (ErrNoRoute), or it is sheddable and every GPU is under
// pressure (ErrOverloaded). limit is the capacity it was measured against.
func (s *Scheduler) refusalLocked(w *waiter) (reason error, limit int64) {
	var largest, largestCap int64
	anyUp, anyFits, anyCap, calm := false, false, false, false
	for _, r := range w.line.q.routes {
		p := r.p
		largest = max(largest, p.nominal)
		tc := w.tenant.capOn(p)
		largestCap = max(largestCap, tc)
		if w.weight <= p.nominal {
			anyFits = true
		}
		if w.charge <= tc {
			anyCap = true
		}
		if !r.up || (w.exclude != nil && p == w.exclude) {
			continue
		}
		anyUp = true
		// Only a sheddable request asks; the forecast's peak (what is
		// committed) is computed only when the worst case held is over the
		// threshold, as it never exceeds the worst case.
		if !calm && w.line.spec.sheddable {
			limit := s.set.pressure * float64(p.effective)
			calm = float64(p.held) <= limit || float64(s.committedLocked(p)) <= limit
		}
	}
	switch {
	case !anyFits:
		return ErrTooLarge, largest
	case !anyCap:
		return ErrTenantQuota, largestCap
	case !anyUp:
		return ErrNoRoute, 0
	case w.line.spec.sheddable && !calm:
		return ErrOverloaded, largest
	}
	return nil, 0
}

// pressureNeedLocked is how much must drain before one of w's GPUs is
// back under the pressure threshold.
func (s *Scheduler) pressureNeedLocked(w *waiter) int64 {
	need := int64(-1)
	for _, r := range w.line.q.routes {
		if eligible(w, r) {
			n := s.committedLocked(r.p) - int64(s.set.pressure*float64(r.p.effective))
			if need < 0 || n < need {
				need = n
			}
		}
	}
	return need
}

// enqueue is Acquire's slow path. Called with mu held; returns with it
// released.
func (s *Scheduler) enqueue(ctx context.Context, w *waiter, now time.Time) (*Ticket, error) {
	l := w.line
	var deadline time.Time
	if l.spec.timeout > 0 {
		deadline = now.Add(l.spec.timeout)
	}
	if !w.deadline.IsZero() && (deadline.IsZero() || w.deadline.Before(deadline)) {
		deadline = w.deadline
	}
	w.deadline = deadline

	maxBytes := l.maxBytes()
	tCount, tBytes := w.tenant.queueLimits(l.spec.maxQueued, maxBytes)
	tq := l.tenants[w.tenant]
	var tn int
	var tb int64
	if tq != nil {
		tn, tb = tq.n, tq.bytes
	}
	if l.spec.maxQueued < 0 || l.queued >= l.spec.maxQueued || (maxBytes >= 0 && l.queuedBytes+w.weight > maxBytes) ||
		tn >= tCount || (tBytes >= 0 && tb+w.weight > tBytes) {
		return nil, s.rejectUnlock(ErrQueueFull, w, s.queueEffectiveLocked(l.q), s.retryLocked(now, w, s.needLocked(w, true)))
	}
	if !deadline.IsZero() {
		left := deadline.Sub(now)
		if left <= 0 {
			return nil, s.rejectUnlock(ErrQueueTimeout, w, s.queueEffectiveLocked(l.q), s.retryLocked(now, w, s.needLocked(w, true)))
		}
		if est, known := s.expectedWaitLocked(now, w, s.needLocked(w, true)); known && est > left {
			return nil, s.rejectUnlock(ErrQueueTimeout, w, s.queueEffectiveLocked(l.q), s.retryLocked(now, w, s.needLocked(w, true)))
		}
	}

	w.enqueued = now
	w.ready = make(chan struct{})
	if w.t == nil {
		w.t = &w.own
	}
	s.enqueueLocked(w)
	if !deadline.IsZero() {
		w.timer = s.clock.AfterFunc(deadline.Sub(now), func() { s.expire(w) })
	}
	s.checkLocked(opEnqueue)
	s.dispatchLocked() // it may pass a head that does not fit, or be one
	s.noteWaitingLocked(w)
	s.unlockNotify()
	return s.wait(ctx, ctx.Done(), w)
}

// wait blocks until w is granted or refused, or ctx is done.
func (s *Scheduler) wait(ctx context.Context, done <-chan struct{}, w *waiter) (*Ticket, error) {
	select {
	case <-w.ready:
	case <-done:
		s.mu.Lock()
		switch w.state {
		case waiting:
			waited := s.clock.Now().Sub(w.enqueued)
			s.dequeueLocked(w)
			w.state = canceled
			s.checkLocked(opCancel)
			s.dispatchLocked() // it may have held back those behind it
			s.mu.Unlock()
			return nil, s.canceledErr(ctx.Err(), w.event(waited))
		case granted: // granted and canceled at the same moment: give it back
			s.ungrantLocked(w)
			s.mu.Unlock()
			return nil, s.canceledErr(ctx.Err(), w.event(w.t.waited))
		}
		s.mu.Unlock() // refused at the same moment: report the refusal
	}
	if w.state == refused {
		s.report(w.err, w.event(w.err.Waited))
		return nil, w.err
	}
	if done != nil {
		select {
		case <-done:
			// Granted, but ctx ended before we could hand the ticket over:
			// the caller will see an error, so nothing may stay held.
			s.mu.Lock()
			s.ungrantLocked(w)
			s.mu.Unlock()
			return nil, s.canceledErr(ctx.Err(), w.event(w.t.waited))
		default:
		}
	}
	s.count.admittedAfterWait.Add(1)
	if s.observer != nil {
		e := w.event(w.t.waited)
		e.GPU, e.Backfilled, e.Preemptive = w.boundTo, w.backfilled, w.preemptive
		s.observer.Admitted(e)
	}
	return w.t, nil
}

// ungrantLocked gives back the weight of a grant nobody received. It is not
// a release: the drain rate does not count it.
func (s *Scheduler) ungrantLocked(w *waiter) {
	s.unholdLocked(w.t, false)
	s.checkLocked(opUngrant)
	s.dispatchLocked()
}

// expire is w's deadline timer.
func (s *Scheduler) expire(w *waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.state != waiting {
		return // granted, canceled or refused first
	}
	now := s.clock.Now()
	s.refuseLocked(w, now, ErrQueueTimeout, s.queueEffectiveLocked(w.line.q), s.retryLocked(now, w, s.needLocked(w, false)))
	s.checkLocked(opRefuse)
	s.dispatchLocked()
}

// rejectUnlock refuses a request that never queued, releases mu, and
// reports the refusal.
func (s *Scheduler) rejectUnlock(reason error, w *waiter, limit int64, retry time.Duration) error {
	e := w.event(0)
	err := &RejectError{Reason: reason, RetryAfter: retry, Weight: w.weight, Capacity: limit,
		Queue: e.Queue, Class: e.Class, Tenant: e.Tenant}
	s.mu.Unlock()
	s.report(err, e)
	return err
}

// report counts a refusal and tells the observer. Called without mu.
func (s *Scheduler) report(err *RejectError, e Event) {
	s.count.rejected[reasonIndex(err.Reason)].Add(1)
	if s.observer != nil {
		s.observer.Rejected(e, reasonLabel(err.Reason))
	}
}

// canceledErr counts a cancellation, tells the observer and wraps ctxErr.
// Called without mu.
func (s *Scheduler) canceledErr(ctxErr error, e Event) error {
	s.count.canceled.Add(1)
	if s.observer != nil {
		s.observer.Rejected(e, ReasonCanceled)
	}
	return fmt.Errorf("admission: queue %q, class %q, tenant %q, weight %d: gave up after waiting %v: %w",
		e.Queue, e.Class, e.Tenant, e.Weight, e.Waited, ctxErr)
}

func (s *Scheduler) queueNamesLocked() string {
	names := make([]string, len(s.queues))
	for i, q := range s.queues {
		names[i] = fmt.Sprintf("%q", q.name)
	}
	return strings.Join(names, ", ")
}

func (s *Scheduler) classNamesLocked() string {
	names := make([]string, len(s.set.classes))
	for i, c := range s.set.classes {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// refuseImpossibleLocked refuses the waiters that can never be admitted
// under the current capacities and tenant caps (after a resize or a
// reconfiguration lowered them) or that have no available GPU left, so that
// none of them holds the queue until its deadline.
func (s *Scheduler) refuseImpossibleLocked(now time.Time) {
	for _, q := range s.queues {
		for _, l := range q.lines {
			for w := l.head; w != nil; {
				next := w.next
				if reason, limit := s.refusalLocked(w); reason != nil && reason != ErrOverloaded {
					s.refuseLocked(w, now, reason, limit, 0)
				}
				w = next
			}
		}
	}
}

// SetAvailable says whether the queue may be bound to the GPU now (the
// gateway: whether a healthy backend of the model runs on that GPU). When
// no GPU of a queue is available its waiters are refused at once with
// ErrNoRoute; when one becomes available the waiters are dispatched to it.
// Unknown names are an error.
func (s *Scheduler) SetAvailable(queue, gpu string, up bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queueByName[queue]
	if q == nil {
		return fmt.Errorf("admission: SetAvailable: unknown queue %q", queue)
	}
	for i := range q.routes {
		r := &q.routes[i]
		if r.p.name != gpu {
			continue
		}
		if r.up == up {
			return nil
		}
		r.up = up
		if !up {
			s.refuseImpossibleLocked(s.clock.Now())
		}
		s.checkLocked(opRoute)
		s.dispatchLocked()
		return nil
	}
	return fmt.Errorf("admission: SetAvailable: queue %q has no GPU %q", queue, gpu)
}
