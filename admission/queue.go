package admission

import (
	"container/heap"
	"time"

	"github.com/kvgate/kvgate/admission/predict"
)

// queue is one line of waiting requests (a model) and the GPUs that may
// serve it. Fields are guarded by Scheduler.mu; name never changes.
type queue struct {
	name    string
	spec    queueSpec
	routes  []route // the GPUs it may be bound to, in configuration order
	lines   []*line // one per class, in priority order
	removed bool    // by Reconfigure: no new requests; its waiters were refused

	// lengths learns the output lengths of the queue's finished sequences;
	// byTenant the same per tenant, byClass per class (bounded: see
	// observeLocked).
	lengths  *predict.Lengths
	byTenant map[string]*predict.Lengths
	byClass  map[string]*predict.Lengths
	// warm says lengths has been trusted since learning (re)started, and
	// the sequences running then taught it as censored samples
	// (warmLocked); warmScopes the same of a tenant's or a class's own.
	warm       bool
	warmScopes map[scopeKey]bool
	// tally and tallyTenants count what this scheduler learned since
	// LengthsDelta last took it; nil until the first call (lengths.go).
	tally        *predict.Tally
	tallyTenants map[string]*predict.Tally
	tallyClasses map[string]*predict.Tally

	// promised are the refusals told to come back at a time still to come,
	// so that the next refusal's Retry-After counts them as ahead of it.
	promised promises

	// trust is what the guard and the overflow signals know of whether the
	// queue's forecast can be believed (guard.go); scopes the change
	// detectors of its tenants and classes (drift.go).
	trust  trustState
	scopes map[scopeKey]*trustState

	// stopPass is the dispatch pass in which a waiter of this queue held
	// back everyone behind it (strict order); resPass the pass in which its
	// first blocked waiter got its reservation.
	stopPass, resPass uint64
}

type route struct {
	p  *gpu
	up bool
}

type promise struct {
	due    time.Time
	charge int64
}

// promises are a queue's outstanding Retry-After promises: a min-heap by
// due time with the sum of their charges, so that a refusal learns what
// is promised ahead of it by dropping those that came due, not by walking
// every one (up to maxPromises of them for each refusal of a queue that
// refuses many).
type promises struct {
	h   promiseHeap
	sum int64
}

// outstanding drops the promises due by now and is the charge of the rest.
func (ps *promises) outstanding(now time.Time) int64 {
	for len(ps.h) > 0 && !ps.h[0].due.After(now) {
		ps.sum -= heap.Pop(&ps.h).(promise).charge
	}
	return ps.sum
}

// add keeps p unless maxPromises are outstanding.
func (ps *promises) add(p promise) {
	if len(ps.h) < maxPromises {
		heap.Push(&ps.h, p)
		ps.sum += p.charge
	}
}

type promiseHeap []promise

func (h promiseHeap) Len() int           { return len(h) }
func (h promiseHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h promiseHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *promiseHeap) Push(x any)        { *h = append(*h, x.(promise)) }
func (h *promiseHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	*h = old[:len(old)-1]
	return p
}

// line is one class of one queue: its spec and its FIFO of waiters.
type line struct {
	q           *queue // fixed
	name        string // fixed: a class's identity across reloads
	spec        classSpec
	index       int // position in the queue's lines; -1 once removed
	head, tail  *waiter
	queued      int
	queuedBytes int64
	held        int64 // weight of the tickets admitted through this line
	tenants     map[*tenantState]*tenantQueued
}

type tenantQueued struct {
	n     int
	bytes int64
}

// maxBytes is the line's queued-weight bound; < 0 means unbounded.
func (l *line) maxBytes() int64 {
	switch {
	case l.spec.maxQueuedBytes > 0:
		return l.spec.maxQueuedBytes
	case l.spec.maxQueuedBytes < 0:
		return -1
	}
	var nominal int64
	for _, r := range l.q.routes {
		nominal = satAdd64(nominal, r.p.nominal)
	}
	return satMul(DefaultQueuedBytesFactor, nominal)
}

func (q *queue) lineLocked(s *Scheduler, class string) *line {
	if class == "" {
		return q.lines[s.set.defaultClass]
	}
	for _, l := range q.lines {
		if l.name == class {
			return l
		}
	}
	return nil
}

func (q *queue) ensureLengths() error {
	if q.lengths != nil && q.lengths.MaxLen() == q.spec.maxLen {
		return nil
	}
	l, err := predict.NewLengths(predict.LengthsConfig{MaxLen: q.spec.maxLen})
	if err != nil {
		return err
	}
	q.resetLengths(l)
	return nil
}

// resetLengths starts q's learning over with l.
func (q *queue) resetLengths(l *predict.Lengths) {
	q.lengths, q.byTenant, q.byClass, q.warm, q.warmScopes = l, map[string]*predict.Lengths{}, map[string]*predict.Lengths{}, false, nil
}

// anyAheadLocked reports whether a new request w must queue behind someone:
// a waiter in its own line or a higher one of its queue (it would pass
// them), or a waiter of its own tenant in its queue at its priority or
// above (a tenant's own requests stay in order).
func (q *queue) anyAheadLocked(w *waiter) bool {
	for i := 0; i <= w.line.index; i++ {
		if q.lines[i].queued > 0 {
			return true
		}
	}
	return false
}

type waiterState uint8

const (
	waiting  waiterState = iota
	granted              // weight held; ticket filled in
	refused              // err set
	canceled             // removed by its own goroutine
)

// waiter is a queued Acquire. Fields are guarded by Scheduler.mu until ready
// is closed; from then on they are final (except that a canceled grant is
// given back under the lock) and the waiting goroutine reads them freely.
type waiter struct {
	t      *Ticket // handed out on grant (&own, or the caller's)
	own    Ticket
	line   *line
	tenant *tenantState
	weight int64 // worst case
	charge int64 // what it counts for against tenant caps and drain (see forecast.go)
	// shared is the part of weight a GPU that shares prompt blocks may
	// hold once for several requests: its shareable blocks (share.go).
	shared int64
	shape  []Group
	opaque bool
	pinned bool
	// noResume: the request cannot be resumed (Request.NoResume).
	noResume bool
	stop     Stopper
	lens     *predict.Lengths // the predictor of its forecast; nil = worst case
	seq      uint64           // arrival order; a moved ticket keeps its own
	// exclude is the GPU a moved ticket must leave; nil otherwise.
	exclude  *gpu
	affinity uint64
	deadline time.Time

	enqueued   time.Time
	ready      chan struct{} // closed once state leaves waiting because of someone else
	timer      Timer         // deadline; nil if none
	prev, next *waiter
	state      waiterState
	err        *RejectError // when refused
	boundTo    string       // the GPU it was granted on
	backfilled bool         // granted past an earlier waiter that did not fit
	preemptive bool         // granted on room of lower classes (preemption.go)
}

// event is w as the Observer sees it.
func (w *waiter) event(waited time.Duration) Event {
	return Event{Queue: w.line.q.name, Class: w.line.name, Tenant: w.tenant.name, Weight: w.weight, Waited: waited}
}

// initWaiterLocked fills w for r, its weight and charge computed from its
// shape under the current predictors. (Acquire keeps w on its stack and
// copies it to the heap only if it must queue.)
func (s *Scheduler) initWaiterLocked(w *waiter, q *queue, l *line, r Request, into *Ticket) {
	t := s.tenantLocked(r.Tenant)
	// w.t stays nil unless the caller gave a ticket: one admitted at once
	// takes a ticket from the slab, one that queues its own.
	*w = waiter{t: into, line: l, tenant: t, shape: r.Shape, opaque: r.Opaque, pinned: r.Pinned, noResume: r.NoResume, stop: r.Stopper,
		affinity: r.Affinity, deadline: r.Deadline}
	s.seq++
	w.seq = s.seq
	if r.Resumes != nil && r.Resumes.s == s && r.Resumes.seq > 0 {
		w.seq = r.Resumes.seq
	}
	if len(r.Shape) == 0 {
		w.weight, w.charge = r.Weight, r.Weight
		return
	}
	w.weight = WorstCaseBytes(r.Shape)
	w.shared = sharedOf(w.shape)
	switch {
	case w.predictable():
		w.lens = s.lengthsForLocked(q, t, l.name)
	case w.certainGrowth():
		w.lens = s.fw.certain
	}
	w.charge = s.chargeLocked(w)
}

func (l *line) pushLocked(w *waiter) {
	// A moved ticket goes back to its place by arrival order; a new one is
	// the newest and goes last.
	at := l.tail
	for at != nil && at.seq > w.seq {
		at = at.prev
	}
	w.prev = at
	if at == nil {
		w.next = l.head
		l.head = w
	} else {
		w.next = at.next
		at.next = w
	}
	if w.next == nil {
		l.tail = w
	} else {
		w.next.prev = w
	}
}

func (l *line) unlinkLocked(w *waiter) {
	if w.prev == nil {
		l.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		l.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next = nil, nil
}

// enqueueLocked appends w to its line and counts it everywhere.
func (s *Scheduler) enqueueLocked(w *waiter) {
	l, t := w.line, w.tenant
	l.pushLocked(w)
	l.queued++
	l.queuedBytes += w.weight
	tq := l.tenants[t]
	if tq == nil {
		tq = &tenantQueued{}
		l.tenants[t] = tq
	}
	tq.n++
	tq.bytes += w.weight
	t.queued++
	t.queuedBytes += w.weight
	s.queued++
}

// dequeueLocked takes w out of its line and out of every count, and stops
// its deadline timer. It does not run dispatch.
func (s *Scheduler) dequeueLocked(w *waiter) {
	l, t := w.line, w.tenant
	l.unlinkLocked(w)
	l.queued--
	l.queuedBytes -= w.weight
	if tq := l.tenants[t]; tq != nil {
		tq.n--
		tq.bytes -= w.weight
		if tq.n == 0 {
			delete(l.tenants, t)
		}
	}
	t.queued--
	t.queuedBytes -= w.weight
	s.queued--
	if w.timer != nil {
		w.timer.Stop()
	}
}

// refuseLocked removes a waiting w with a refusal and wakes its goroutine,
// which reports it. RetryAfter must already be computed by the caller.
func (s *Scheduler) refuseLocked(w *waiter, now time.Time, reason error, limit int64, retry time.Duration) {
	s.dequeueLocked(w)
	w.state = refused
	w.err = &RejectError{Reason: reason, RetryAfter: retry, Weight: w.weight, Capacity: limit,
		Waited: now.Sub(w.enqueued), Queue: w.line.q.name, Class: w.line.name, Tenant: w.tenant.name}
	close(w.ready)
}

// grantLocked admits w on p: it leaves the queue and its ticket holds.
func (s *Scheduler) grantLocked(w *waiter, p *gpu, now time.Time, backfill bool) {
	s.dequeueLocked(w)
	s.holdPreemptiveLocked(w, s.holdLocked(w, p, now.Sub(w.enqueued)))
	w.state, w.boundTo, w.backfilled = granted, p.name, backfill
	if backfill {
		s.backfilled++
	}
	close(w.ready)
	s.checkLocked(opGrant)
}
