package admission

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Request is one request for weight.
type Request struct {
	Weight int64 // predicted KV bytes; must be > 0
	// Class names a configured class; "" = Config.DefaultClass (see there).
	// An unknown class is an error, not a refusal.
	Class string
	// Tenant is who pays; "" = the anonymous tenant, bounded by
	// Config.DefaultTenantShare like any unlisted tenant.
	Tenant string
	// Deadline bounds the time in the queue; zero = the class's QueueTimeout
	// only. The effective deadline is the earlier of the two.
	Deadline time.Time
}

// Budget is a memory-weighted admission controller over one capacity (one
// GPU's KV budget). See the package documentation for its model.
//
// Locking: mu guards every field below it. It is a leaf lock except for the
// Clock: the budget calls Clock.AfterFunc and Timer.Stop with mu held, so a
// Clock must never call back into the budget while holding a lock of its
// own (timer functions run in their own goroutines and take mu themselves).
// Methods named ...Locked expect mu held. Observer callbacks and the
// waiters' own bookkeeping run after mu is released.
type Budget struct {
	clock    Clock    // fixed at New
	observer Observer // fixed at New; nil = none
	count    counters // atomics; no lock

	mu          sync.Mutex
	set         settings
	nominal     int64 // configured capacity
	effective   int64 // nominal after AIMD; held <= effective at every admission
	held        int64
	classes     []*classState // priority order
	defClass    *classState
	tenants     map[string]*tenantState // includes "" (anon)
	anon        *tenantState
	queued      int
	queuedBytes int64
	// blocker is the head-of-line blocker left by the last dispatch pass (or
	// an enqueue that became one), nil if none: a new request of its class
	// or a higher one must queue behind it.
	blocker *waiter
	pass    uint64   // dispatch pass counter, for tenantState.pass
	sweepAt int      // tenant map size that triggers sweepIdleTenantsLocked
	slab    []Ticket // fresh tickets for the fast path, see newTicketLocked
	// admittedAtOnce counts the fast path's admissions; under mu, which it
	// holds anyway, rather than in the atomic counters.
	admittedAtOnce int64
	drain          drainEstimator
	knobs          testingKnobs
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
	opUngrant     = "ungrant" // a grant given back because the context ended at the same time
	opEnqueue     = "enqueue"
	opRefuse      = "refuse"
	opCancel      = "cancel"
	opResize      = "resize"
	opFeedback    = "feedback"
	opReconfigure = "reconfigure"
)

func (b *Budget) checkLocked(op string) {
	if b.knobs.check != nil {
		b.knobs.check(op)
	}
}

// New validates cfg and returns a budget with nothing held.
func New(cfg Config) (*Budget, error) {
	s, err := resolve(cfg)
	if err != nil {
		return nil, err
	}
	b := &Budget{clock: cfg.Clock, observer: cfg.Observer,
		nominal: s.capacity, effective: s.capacity, tenants: make(map[string]*tenantState)}
	if b.clock == nil {
		b.clock = SystemClock()
	}
	b.mu.Lock()
	b.applyLocked(s, b.clock.Now())
	b.mu.Unlock()
	return b, nil
}

// Reconfigure applies a new configuration (Clock and Observer excepted) as
// one step. Held tickets stay valid whatever changes. Waiters keep their
// place and deadline; those of a removed class are refused with
// ErrQueueFull, and those that can no longer ever fit (weight above the new
// capacity or their tenant's new cap) with ErrTooLarge or ErrTenantQuota.
// Lowered queue bounds evict nobody: they refuse new arrivals until the
// queue is back under them. A changed DrainWindow restarts the drain-rate
// measurement. If cfg is invalid nothing changes and the error names the
// fields.
func (b *Budget) Reconfigure(cfg Config) error {
	s, err := resolve(cfg)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.applyLocked(s, b.clock.Now())
	b.mu.Unlock()
	return nil
}

func (b *Budget) applyLocked(s settings, now time.Time) {
	oldWindow := b.set.drainWindow
	b.set = s
	if s.capacity != b.nominal {
		b.resizeLocked(s.capacity)
	}

	// Classes keep their state (queue, held) across reloads by name.
	byName := make(map[string]*classState, len(b.classes))
	for _, c := range b.classes {
		byName[c.name] = c
	}
	classes := make([]*classState, len(s.classes))
	for i, spec := range s.classes {
		c := byName[spec.name]
		if c == nil {
			c = &classState{budget: b, name: spec.name}
		}
		delete(byName, spec.name)
		c.spec = spec
		classes[i] = c
	}
	for _, c := range b.classes {
		if _, removed := byName[c.name]; !removed {
			continue
		}
		for w := c.head; w != nil; {
			next := w.next
			retry := b.retryLocked(now, b.needLocked(b.queuedBytes-w.weight, w.t.tenant, 0, w.weight))
			b.refuseLocked(w, now, ErrQueueFull, b.effective, retry)
			w = next
		}
		c.index = -1
	}
	b.classes = classes
	for i, c := range classes {
		c.index = i
	}
	b.defClass = classes[s.defaultClass]

	// Tenants: listed ones are permanent; the rest follow the default share.
	if b.anon == nil {
		b.anon = &tenantState{name: ""}
		b.tenants[""] = b.anon
	}
	for name := range s.tenants {
		if b.tenants[name] == nil {
			b.tenants[name] = &tenantState{name: name}
		}
	}
	for name, t := range b.tenants {
		spec, listed := s.tenants[name]
		if !listed {
			spec = tenantSpec{share: s.defaultShare, queueShare: s.defaultShare}
		}
		t.share, t.queueShare, t.permanent = spec.share, spec.queueShare, listed || name == ""
		t.setCapLocked(b.nominal)
		t.queued, t.queuedBytes = make([]int, len(classes)), make([]int64, len(classes))
	}
	for i, c := range classes {
		for w := c.head; w != nil; w = w.next {
			w.t.tenant.queued[i]++
			w.t.tenant.queuedBytes[i] += w.weight
		}
	}
	b.sweepIdleTenantsLocked()

	if s.drainWindow != oldWindow {
		b.drain = newDrainEstimator(now, s.drainWindow)
	}
	b.refuseImpossibleLocked(now)
	b.checkLocked(opReconfigure)
	b.dispatchLocked()
}

// Resize sets the nominal capacity (the backend reported a new pool size).
// The effective capacity keeps its ratio to the nominal one. Held weight is
// never revoked: after a shrink, admissions stop until held is under the new
// capacity. Waiters that can no longer ever fit are refused (ErrTooLarge, or
// ErrTenantQuota when their tenant's cap shrank below them).
func (b *Budget) Resize(capacity int64) error {
	if capacity <= 0 {
		return fmt.Errorf("admission: resize: capacity %d must be > 0", capacity)
	}
	b.mu.Lock()
	b.resizeLocked(capacity)
	b.refuseImpossibleLocked(b.clock.Now())
	b.checkLocked(opResize)
	b.dispatchLocked()
	b.mu.Unlock()
	return nil
}

func (b *Budget) resizeLocked(capacity int64) {
	old := b.nominal
	b.nominal = capacity
	if b.effective >= old {
		b.effective = capacity
	} else {
		scaled := int64(float64(b.effective) * (float64(capacity) / float64(old)))
		b.effective = min(capacity, max(scaled, b.minEffectiveLocked()))
	}
	for _, t := range b.tenants {
		t.setCapLocked(capacity)
	}
}

// Free is the effective capacity minus what is held: what a new request
// could take at once if nobody waits. It is negative after a shrink below
// what is held.
func (b *Budget) Free() int64 {
	b.mu.Lock()
	free := b.effective - b.held
	b.mu.Unlock()
	return free
}

func (b *Budget) classLocked(name string) *classState {
	if name == "" {
		return b.defClass
	}
	for _, c := range b.classes {
		if c.name == name {
			return c
		}
	}
	return nil
}

func (b *Budget) classNamesLocked() string {
	names := make([]string, len(b.classes))
	for i, c := range b.classes {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// Acquire admits r at once if it fits and nobody it must not overtake is
// waiting, else queues it until it is admitted, refused, or ctx is done.
// A refusal is a *RejectError; a ctx that ends first gives an error wrapping
// ctx.Err(). Either way nothing stays held. An invalid request (weight <= 0,
// unknown class) is a plain error.
func (b *Budget) Acquire(ctx context.Context, r Request) (*Ticket, error) {
	return b.acquire(ctx, r, nil)
}

// AcquireTicket is Acquire into a Ticket the caller owns (a field of its
// per-request state, say), so that an admission that fits at once allocates
// nothing. t must hold nothing: the zero Ticket, or one already released.
// Reusing a released Ticket starts a new admission in it, so the caller must
// make sure no stale Release of the old one can still run. On error t holds
// nothing.
func (b *Budget) AcquireTicket(ctx context.Context, r Request, t *Ticket) error {
	if t == nil {
		return errors.New("admission: AcquireTicket: nil ticket")
	}
	_, err := b.acquire(ctx, r, t)
	return err
}

// acquire is Acquire and AcquireTicket; into is nil for Acquire.
func (b *Budget) acquire(ctx context.Context, r Request, into *Ticket) (*Ticket, error) {
	w := r.Weight
	if w <= 0 {
		return nil, fmt.Errorf("admission: weight %d: must be > 0", w)
	}
	done := ctx.Done()
	b.mu.Lock()
	if into != nil {
		if into.weight != 0 {
			held := into.weight
			b.mu.Unlock()
			return nil, fmt.Errorf("admission: AcquireTicket: the ticket still holds %d", held)
		}
		into.waited = 0
	}
	c := b.classLocked(r.Class)
	if c == nil {
		names := b.classNamesLocked()
		b.mu.Unlock()
		return nil, fmt.Errorf("admission: class %q: unknown (have %s)", r.Class, names)
	}
	if done != nil {
		select {
		case <-done:
			// ctx ending has happened before the call: fail, as x/sync's
			// semaphore does, even if the weight is free.
			b.mu.Unlock()
			return nil, b.canceledErr(ctx.Err(), c.name, r.Tenant, w, 0)
		default:
		}
	}
	t := b.tenantLocked(r.Tenant)
	if w > b.nominal {
		return nil, b.rejectUnlock(ErrTooLarge, c, t, w, b.nominal, 0)
	}
	if w > t.cap {
		return nil, b.rejectUnlock(ErrTenantQuota, c, t, w, t.cap, 0)
	}
	if c.spec.sheddable && float64(b.held) > b.set.pressure*float64(b.effective) {
		need := b.held - int64(b.set.pressure*float64(b.effective))
		return nil, b.rejectUnlock(ErrOverloaded, c, t, w, b.effective, b.retryLocked(b.clock.Now(), need))
	}
	ci := c.index
	if b.held+w <= b.effective && t.held+w <= t.cap && (b.blocker == nil || b.blocker.t.class.index > ci) &&
		!t.queuedUpToLocked(ci) {
		b.holdLocked(c, t, w)
		tk := into
		if tk == nil {
			tk = b.newTicketLocked()
		}
		tk.class, tk.tenant, tk.weight = c, t, w
		b.admittedAtOnce++
		if b.blocker != nil && b.blocker.t.tenant == t {
			// Its tenant's new weight may have put the blocker over its cap:
			// it is then skipped, and those behind it may fit.
			b.dispatchLocked()
		}
		b.checkLocked(opAdmit)
		b.mu.Unlock()
		if b.observer != nil {
			b.observer.Admitted(c.name, t.name, w, 0)
		}
		return tk, nil
	}
	return b.enqueue(ctx, done, c, t, r, into)
}

// enqueue is Acquire's slow path. Called with mu held; returns with it
// released.
func (b *Budget) enqueue(ctx context.Context, done <-chan struct{}, c *classState, t *tenantState, r Request, into *Ticket) (*Ticket, error) {
	w, ci := r.Weight, c.index
	now := b.clock.Now()
	var deadline time.Time
	if c.spec.timeout > 0 {
		deadline = now.Add(c.spec.timeout)
	}
	if !r.Deadline.IsZero() && (deadline.IsZero() || r.Deadline.Before(deadline)) {
		deadline = r.Deadline
	}

	var ahead, tAhead int64
	for i := 0; i <= ci; i++ {
		ahead += b.classes[i].queuedBytes
		tAhead += t.queuedBytes[i]
	}
	need := b.needLocked(ahead, t, tAhead, w)
	est, known := b.drain.wait(now, need)
	retry := b.clampRetryLocked(est, known)

	maxBytes := c.maxBytes(b.nominal)
	tCount, tBytes := t.queueLimits(c.spec.maxQueued, maxBytes)
	if c.spec.maxQueued < 0 || c.queued >= c.spec.maxQueued || (maxBytes >= 0 && c.queuedBytes+w > maxBytes) ||
		t.queued[ci] >= tCount || (tBytes >= 0 && t.queuedBytes[ci]+w > tBytes) {
		return nil, b.rejectUnlock(ErrQueueFull, c, t, w, b.effective, retry)
	}
	if !deadline.IsZero() {
		if left := deadline.Sub(now); left <= 0 || (known && est > left) {
			return nil, b.rejectUnlock(ErrQueueTimeout, c, t, w, b.effective, retry)
		}
	}

	// It becomes the head-of-line blocker if dispatch would stop at it: no
	// blocker at its priority or above, nothing of its tenant ahead, and
	// within its tenant's cap (so it is the capacity it lacks).
	blocker := (b.blocker == nil || b.blocker.t.class.index > ci) && !t.queuedUpToLocked(ci) && t.held+w <= t.cap
	wt := &waiter{weight: w, enqueued: now, ready: make(chan struct{}), t: into}
	if wt.t == nil {
		wt.t = &wt.own
	}
	wt.t.class, wt.t.tenant = c, t
	b.enqueueLocked(wt)
	switch {
	case blocker:
		b.blocker = wt
	case b.blocker != nil && b.blocker.t.tenant == t && b.blocker.t.class.index > ci:
		// wt is skipped and comes before its own tenant's blocker in a pass,
		// so the blocker is skipped from now on too: whoever it held back
		// may go.
		b.dispatchLocked()
	}
	if !deadline.IsZero() {
		wt.timer = b.clock.AfterFunc(deadline.Sub(now), func() { b.expire(wt) })
	}
	b.checkLocked(opEnqueue)
	b.mu.Unlock()
	return b.wait(ctx, done, wt)
}

// wait blocks until w is granted or refused, or ctx is done.
func (b *Budget) wait(ctx context.Context, done <-chan struct{}, w *waiter) (*Ticket, error) {
	select {
	case <-w.ready:
	case <-done:
		b.mu.Lock()
		switch w.state {
		case waiting:
			waited := b.clock.Now().Sub(w.enqueued)
			b.dequeueLocked(w)
			w.state = canceled
			b.checkLocked(opCancel)
			b.dispatchLocked() // it may have been the head-of-line blocker
			b.mu.Unlock()
			return nil, b.canceledErr(ctx.Err(), w.t.class.name, w.t.tenant.name, w.weight, waited)
		case granted: // granted and canceled at the same moment: give it back
			b.ungrantLocked(w)
			b.mu.Unlock()
			return nil, b.canceledErr(ctx.Err(), w.t.class.name, w.t.tenant.name, w.weight, w.t.waited)
		}
		b.mu.Unlock() // refused at the same moment: report the refusal
	}
	if w.state == refused {
		b.report(w.err)
		return nil, w.err
	}
	if done != nil {
		select {
		case <-done:
			// Granted, but ctx ended before we could hand the ticket over:
			// the caller will see an error, so nothing may stay held.
			b.mu.Lock()
			b.ungrantLocked(w)
			b.mu.Unlock()
			return nil, b.canceledErr(ctx.Err(), w.t.class.name, w.t.tenant.name, w.weight, w.t.waited)
		default:
		}
	}
	b.count.admittedAfterWait.Add(1)
	if b.observer != nil {
		b.observer.Admitted(w.t.class.name, w.t.tenant.name, w.weight, w.t.waited)
	}
	return w.t, nil
}

// ungrantLocked gives back the weight of a grant nobody received. It is not
// a release: the drain rate does not count it.
func (b *Budget) ungrantLocked(w *waiter) {
	b.unholdLocked(w.t.class, w.t.tenant, w.t.weight)
	w.t.weight = 0
	b.checkLocked(opUngrant)
	b.dispatchLocked()
}

// expire is w's deadline timer.
func (b *Budget) expire(w *waiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.state != waiting {
		return // granted, canceled or refused first
	}
	now := b.clock.Now()
	ahead, tAhead := b.aheadOfLocked(w)
	retry := b.retryLocked(now, b.needLocked(ahead, w.t.tenant, tAhead, w.weight))
	b.refuseLocked(w, now, ErrQueueTimeout, b.effective, retry)
	b.checkLocked(opRefuse)
	b.dispatchLocked()
}

// aheadOfLocked is the queued weight that would be admitted before w, in
// all and of w's tenant.
func (b *Budget) aheadOfLocked(w *waiter) (ahead, tAhead int64) {
	c, t := w.t.class, w.t.tenant
	for i := 0; i < c.index; i++ {
		ahead += b.classes[i].queuedBytes
		tAhead += t.queuedBytes[i]
	}
	for x := c.head; x != w; x = x.next {
		ahead += x.weight
		if x.t.tenant == t {
			tAhead += x.weight
		}
	}
	return ahead, tAhead
}

// rejectUnlock refuses a request that never queued, releases mu, and
// reports the refusal.
func (b *Budget) rejectUnlock(reason error, c *classState, t *tenantState, w, limit int64, retry time.Duration) error {
	err := &RejectError{Reason: reason, RetryAfter: retry, Weight: w, Capacity: limit, Class: c.name, Tenant: t.name}
	b.mu.Unlock()
	b.report(err)
	return err
}

// report counts a refusal and tells the observer. Called without mu.
func (b *Budget) report(err *RejectError) {
	b.count.rejected[reasonIndex(err.Reason)].Add(1)
	if b.observer != nil {
		b.observer.Rejected(err.Class, err.Tenant, reasonLabel(err.Reason), err.Weight, err.Waited)
	}
}

// canceledErr counts a cancellation, tells the observer and wraps ctxErr.
// Called without mu.
func (b *Budget) canceledErr(ctxErr error, class, tenant string, w int64, waited time.Duration) error {
	b.count.canceled.Add(1)
	if b.observer != nil {
		b.observer.Rejected(class, tenant, ReasonCanceled, w, waited)
	}
	return fmt.Errorf("admission: class %q, tenant %q, weight %d: gave up after waiting %v: %w", class, tenant, w, waited, ctxErr)
}
