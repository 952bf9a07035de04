package admission

import (
	"fmt"
	"math"
	"time"
)

// An external limit on a GPU: the part of a GPU's budget this process may
// use when several processes (gateway replicas) share the GPU. Something
// outside the package — a lessee of package admission/sharedbudget — leases that
// part from a shared store, reads the GPU's Demand to know how much to
// lease, and sets the GPU's limit to what it holds. The GPU never revokes:
// a lower limit only stops admissions, exactly as a shrink of the effective
// capacity does (see doc.go, "Invariants"); a higher one dispatches waiters
// at once.
//
// The limit and the AIMD loop are independent: admissions are measured
// against min(effective, limit). The pressure threshold (sheddable classes)
// and the headroom gate stay measured against the effective capacity: a
// lease follows demand, so a busy replica's commitments sit near its limit
// whatever the GPU's state, and the backend's reported use is the whole
// GPU's, not this replica's part.

// limitState is the scheduler's part of the limits: fixed at New.
type limitState struct {
	limited  bool             // new GPUs start limited at 0 (Config.Limited)
	onDemand func(gpu string) // Config.OnDemand; nil = none
	notes    []*gpu           // GPUs whose OnDemand is due at the next unlockNotify; guarded by mu
	// horizons counts the GPUs whose limit has a horizon (guarded by mu):
	// while it is 0 no admission reads the clock for them.
	horizons int
}

// A limit may come with a horizon (SetLimitUntil): a lease is trusted only
// until a time measured on this process's own clock, and a process that was
// paused, or cut off from the store, must not resume admitting on a lease
// the others may have taken since. The horizon is checked where admissions
// happen — the fast path of Acquire and every dispatch — not by a timer, so
// no admission can slip in between the horizon and a timer firing late (a
// paused process's timers and its request goroutines resume together).
// Past the horizon the limit is 0 until the next SetLimit or SetLimitUntil:
// nothing new is admitted on the lease until its holder has confirmed it.

// expireLimitsLocked sets to 0 the limits whose horizon has passed.
func (s *Scheduler) expireLimitsLocked() {
	if s.limits.horizons == 0 {
		return
	}
	now := s.clock.Now()
	for _, p := range s.gpus {
		if !p.limitUntil.IsZero() && !now.Before(p.limitUntil) {
			p.limit, p.limitUntil = 0, time.Time{}
			s.limits.horizons--
		}
	}
}

// admitCap is what admissions to p are measured against: its effective
// capacity less the memory nobody admitted (SetUnaccounted), or its
// external limit if that is lower. Each input that takes room off a GPU is
// its own term here, so that they neither hide nor double one another.
func (p *gpu) admitCap() int64 {
	c := max(0, p.effective-p.report.unaccounted)
	if p.limited && p.limit < c {
		return p.limit
	}
	return c
}

// limitOrNone is p's limit for Stats: -1 when it has none.
func (p *gpu) limitOrNone() int64 {
	if !p.limited {
		return -1
	}
	return p.limit
}

// SetLimit caps what the GPU may commit (Stats' Committed: the held worst
// case, or under Predicted the forecast peak) at limit, on top of the
// effective capacity: admissions are measured against the smaller of the
// two. A negative limit removes the cap (the default, unless
// Config.Limited). Lowering it revokes nothing: admissions to the GPU stop
// until its commitments are back under it. Raising it admits the waiters
// that fit before it returns. The limit is in force when SetLimit returns,
// so that a caller that then reads Demand sees every admission made under
// the old one.
func (s *Scheduler) SetLimit(gpu string, limit int64) error {
	return s.SetLimitUntil(gpu, limit, time.Time{})
}

// SetLimitUntil is SetLimit with a horizon: from until on (by the
// scheduler's Clock) the GPU admits as if its limit were 0, until the next
// SetLimit or SetLimitUntil. A zero until is no horizon; so is a negative
// limit (no cap).
func (s *Scheduler) SetLimitUntil(gpu string, limit int64, until time.Time) error {
	s.mu.Lock()
	p := s.gpuByName[gpu]
	if p == nil {
		s.mu.Unlock()
		return fmt.Errorf("admission: limit: unknown GPU %q", gpu)
	}
	s.expireLimitsLocked()
	old := p.admitCap()
	p.limited, p.limit = limit >= 0, max(limit, 0)
	if limit < 0 {
		until = time.Time{}
	}
	if had := !p.limitUntil.IsZero(); had != !until.IsZero() {
		if had {
			s.limits.horizons--
		} else {
			s.limits.horizons++
		}
	}
	p.limitUntil = until
	s.expireLimitsLocked() // an until already past
	if p.admitCap() > old {
		s.dispatchLocked()
	} else {
		s.checkLocked(opLimit)
	}
	s.unlockNotify()
	return nil
}

// opLimit names SetLimit in the invariant checks.
const opLimit = "limit"

// opUnaccounted names SetUnaccounted in the invariant checks.
const opUnaccounted = "unaccounted"

// Demand is what the GPU is asked for, in the units of its commitments:
// held is what it has committed now (Stats' Committed), queued the Σ charge
// of the requests waiting in every queue that may be bound to it (an
// available route, not excluded by a Move). A waiter whose queue has
// several GPUs counts in full on each of them — it is not known which will
// take it — so the queued demand of GPUs that share queues is
// over-counted: a limiter leases ahead of what will be bound, never behind.
// A GPU a Reconfigure removed is asked for what its running tickets still
// hold, and nothing queued: its lessee must not give back what they hold.
// An unknown GPU has no demand.
func (s *Scheduler) Demand(gpu string) (held, queued int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.gpuByName[gpu]
	if p == nil {
		if r := s.retired[gpu]; r != nil {
			return s.committedLocked(r), 0
		}
		return 0, 0
	}
	held = s.committedLocked(p)
	s.waitersForLocked(p, func(w *waiter) bool {
		queued = satAdd64(queued, w.charge)
		return true
	})
	return held, queued
}

// waitersForLocked calls each for the waiters that may be bound to p (in
// a queue that may use it, not excluded from it), each line in its order,
// moving to the next line when each returns false.
func (s *Scheduler) waitersForLocked(p *gpu, each func(*waiter) bool) {
	for _, q := range s.queues {
		if !q.mayUseLocked(p) {
			continue
		}
		for _, l := range q.lines {
			for w := l.head; w != nil; w = w.next {
				if w.exclude != p && !each(w) {
					break
				}
			}
		}
	}
}

// Head is the request that has waited longest among those that may be
// bound to GPU (as Demand counts them): its charge, and how long it has
// waited by the scheduler's clock; 0, 0 when none waits. A fleet gives the
// replica whose head has waited longest, and cannot fit at its fair part of
// the GPU, a turn at the lease that head needs.
func (s *Scheduler) Head(gpu string) (charge int64, waited time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.gpuByName[gpu]
	if p == nil {
		return 0, 0
	}
	var oldest *waiter
	s.waitersForLocked(p, func(w *waiter) bool {
		if oldest == nil || w.enqueued.Before(oldest.enqueued) {
			oldest = w
		}
		return false // the rest of its line came after it
	})
	if oldest == nil {
		return 0, 0
	}
	return oldest.charge, max(0, s.clock.Now().Sub(oldest.enqueued))
}

// mayUseLocked says whether q's waiters may be bound to p now.
func (q *queue) mayUseLocked(p *gpu) bool {
	for _, r := range q.routes {
		if r.p == p {
			return r.up
		}
	}
	return false
}

// noteDemandLocked makes OnDemand due for p at the next unlockNotify.
func (s *Scheduler) noteDemandLocked(p *gpu) {
	if s.limits.onDemand == nil || p.noted {
		return
	}
	p.noted = true
	s.limits.notes = append(s.limits.notes, p)
}

// noteWaitingLocked makes OnDemand due for every GPU w may use, if w is
// still waiting after the dispatch that followed its arrival: none had room.
func (s *Scheduler) noteWaitingLocked(w *waiter) {
	if s.limits.onDemand == nil || w.state != waiting {
		return
	}
	for _, r := range w.line.q.routes {
		if eligible(w, r) {
			s.noteDemandLocked(r.p)
		}
	}
}

// unlockNotify releases mu, then calls OnDemand for every GPU noted since
// the last call, each once. Notes made before a plain mu.Unlock wait for the
// next unlockNotify: OnDemand hurries a limiter that also runs on its own
// timers, so a late call costs time, not safety.
func (s *Scheduler) unlockNotify() {
	stops := s.stops.pending
	if len(stops) > 0 {
		s.stops.pending = nil
		defer flushStops(stops)
	}
	if len(s.limits.notes) == 0 {
		s.mu.Unlock()
		return
	}
	var buf [8]string // the names of the GPUs noted: a handful, kept off the heap
	names := buf[:0]
	for i, p := range s.limits.notes {
		p.noted = false
		names = append(names, p.name)
		s.limits.notes[i] = nil
	}
	s.limits.notes = s.limits.notes[:0]
	s.mu.Unlock()
	for _, name := range names {
		s.limits.onDemand(name)
	}
}

// SetMargin scales the safety margin of the GPU's forecast (Predicted
// only): its bound is the forecast mean plus scale × z(epsilon) standard
// deviations. A process that runs one of k independent batches on a GPU —
// a replica of a fleet sharing its budget — keeps ε for the GPU as a whole
// with scale 1/√k: the deviations of independent batches add as squares,
// so k margins of z/√k each sum to the z·√k the GPU's whole batch needs,
// where k full margins would keep √k times too much of the GPU empty. The
// caller sizes k from the batches' shares (see the gateway's fleet); scale
// is clamped to [1/16, 1], 1 being the default. A lower margin dispatches
// the waiters that now fit before it returns; a higher one revokes
// nothing.
func (s *Scheduler) SetMargin(gpu string, scale float64) error {
	if math.IsNaN(scale) {
		return fmt.Errorf("admission: margin of %q: scale is NaN", gpu)
	}
	scale = min(max(scale, minMargin), 1)
	s.mu.Lock()
	p := s.gpuByName[gpu]
	if p == nil {
		s.mu.Unlock()
		return fmt.Errorf("admission: margin: unknown GPU %q", gpu)
	}
	old := p.marginOrOne()
	p.margin = scale
	p.boundOK = false
	if scale < old {
		s.dispatchLocked()
	} else {
		s.checkLocked(opMargin)
	}
	s.unlockNotify()
	return nil
}

// minMargin bounds SetMargin: 1/√256, a GPU shared by 256 equal batches.
const minMargin = 1.0 / 16

// opMargin names SetMargin in the invariant checks.
const opMargin = "margin"

// marginOrOne is p's margin scale; the zero value is the default, 1.
func (p *gpu) marginOrOne() float64 {
	if p.margin == 0 {
		return 1
	}
	return p.margin
}
