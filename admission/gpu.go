package admission

import (
	"fmt"
	"time"
)

// gpu is one budget (one GPU). Fields are guarded by Scheduler.mu; name
// never changes.
type gpu struct {
	name      string
	index     int   // position in Scheduler.GPUs; -1 once removed by Reconfigure
	nominal   int64 // configured capacity, or as resized
	effective int64 // nominal after AIMD; what admissions are measured against
	held      int64 // Σ worst-case weight of its tickets
	// elsewhere is what other gateway replicas sharing the GPU hold and
	// want for each tenant there (SetTenantsElsewhere): their holds count
	// against the tenant's share as its own do, and their demand sets this
	// replica's part of it (tenant.go).
	elsewhere map[string]TenantLoad
	// fixedHeld is the part of held whose tickets the guard cannot stop
	// expecting a resume: NoResume ones, and those with no Stopper.
	fixedHeld int64
	charge    int64 // Σ charge of its tickets (== held under WorstCase)
	tickets   int
	first     *Ticket // its tickets, newest first (for forecasts and shadows)

	// fc is Σ of its tickets' forecasts (Predicted only); fcOps counts the
	// incremental updates since it was last rebuilt from scratch, and
	// boundOK says whether bound is its current peak.
	fc      curve
	fcOps   int
	bound   float64
	boundOK bool

	// now is Σ of its tickets' guard.now, what they may hold on the
	// backend at this moment; stopping the part of it whose tickets the
	// guard stopped and that are still to be released (guard.go).
	now, stopping int64
	// preempting is Σ worst case of its tickets that started on room of
	// lower classes (preemption.go).
	preempting int64

	// sharing says its backends hold a shared prompt block once
	// (SetSharing); table counts the holders of each such block its tickets
	// hold, tableBytes their bytes (part of held and charge), sharedRefs
	// the bytes its tickets would hold without sharing (share.go).
	sharing    bool
	table      blockTable
	tableBytes int64
	sharedRefs int64
	// hits counts, over the admissions to it, the shareable prompt blocks
	// (prompt) and those found held already (held).
	hits struct{ prompt, held int64 }

	report backendReport

	// limited says limit caps what it may commit (SetLimit); noted that
	// OnDemand is due for it once the lock is released (limit.go).
	limited bool
	limit   int64
	noted   bool
	// limitUntil is when limit stops being trusted (SetLimitUntil); zero:
	// never. Past it the GPU admits as if its limit were 0.
	limitUntil time.Time
	// margin scales the forecast's safety margin (SetMargin); 0 means 1.
	margin float64

	drain drainEstimator
	// res is the reservation the last dispatch pass left on the GPU for
	// the first waiter that did not fit (see dispatch.go).
	res reservation
}

// backendReport is what a GPU's backends last said of its memory.
type backendReport struct {
	used  int64 // KV in use as its backends last reported it
	known bool  // used has been reported
	// unaccounted is the part of it that no admitted request accounts for
	// (SetUnaccounted): admissions are measured against effective less it.
	unaccounted int64
}

func newGPU(name string, capacity int64, now time.Time, window time.Duration) *gpu {
	return &gpu{name: name, nominal: capacity, effective: capacity, drain: newDrainEstimator(now, window)}
}

// Resize sets a GPU's nominal capacity (its backend reported a new KV pool
// size). The effective capacity keeps its ratio to the nominal one. Held
// weight is never revoked: after a shrink, admissions to it stop until what
// it holds is under the new capacity. Waiters that can no longer ever fit
// anywhere are refused (ErrTooLarge, or ErrTenantQuota when their tenant's
// cap shrank below them).
func (s *Scheduler) Resize(gpu string, capacity int64) error {
	if capacity <= 0 {
		return fmt.Errorf("admission: resize %q: capacity %d must be > 0", gpu, capacity)
	}
	s.mu.Lock()
	p := s.gpuByName[gpu]
	if p == nil {
		s.mu.Unlock()
		return fmt.Errorf("admission: resize: unknown GPU %q", gpu)
	}
	s.resizeGPULocked(p, capacity)
	s.refuseImpossibleLocked(s.clock.Now())
	s.guardCheckLocked(p) // a backend that reports a smaller KV pool has less room now
	s.checkLocked(opResize)
	s.dispatchLocked()
	s.unlockNotify()
	return nil
}

func (s *Scheduler) resizeGPULocked(p *gpu, capacity int64) {
	old := p.nominal
	p.nominal = capacity
	if p.effective >= old {
		p.effective = capacity
	} else {
		scaled := int64(float64(p.effective) * (float64(capacity) / float64(old)))
		p.effective = min(capacity, max(scaled, s.minEffectiveLocked(p)))
	}
	p.boundOK = false
}

// Feedback closes the loop with a backend's own measurement of its KV
// cache. over = true (the backend uses more than the budget, or preempted:
// the predictions were low) multiplies the GPU's effective capacity by
// AIMD.Decrease, never below AIMD.MinFraction of the nominal capacity; false
// adds back AIMD.Increase of the nominal capacity (at least 1), never above
// it. Shrinking revokes nothing already held; growing admits waiters at
// once.
func (s *Scheduler) Feedback(gpu string, over bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.gpuByName[gpu]
	if p == nil {
		return fmt.Errorf("admission: feedback: unknown GPU %q", gpu)
	}
	old := p.effective
	if over {
		p.effective = min(old, max(int64(float64(old)*s.set.aimd.decrease), s.minEffectiveLocked(p)))
	} else {
		p.effective = min(p.nominal, old+max(1, int64(s.set.aimd.increase*float64(p.nominal))))
	}
	if p.effective > old {
		s.dispatchLocked()
	} else {
		s.checkLocked(opFeedback)
	}
	return nil
}

// minEffectiveLocked is the floor the AIMD loop never shrinks below.
func (s *Scheduler) minEffectiveLocked(p *gpu) int64 {
	return max(1, int64(s.set.aimd.minFraction*float64(p.nominal)))
}

// SetUsage tells the scheduler how much of a GPU its backends report in
// use (bytes): the ground truth behind Predicted's forecast. While it is
// above (1 − Policy.Headroom) × the effective capacity, nothing new is
// admitted to the GPU under Predicted. known = false forgets it (the
// backend stopped reporting).
func (s *Scheduler) SetUsage(gpu string, used int64, known bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.gpuByName[gpu]
	if p == nil {
		return fmt.Errorf("admission: usage: unknown GPU %q", gpu)
	}
	wasGated := s.gatedLocked(p)
	p.report.used, p.report.known = used, known
	s.checkLocked(opUsage)
	if wasGated && !s.gatedLocked(p) {
		s.dispatchLocked()
	}
	return nil
}

// gatedLocked says whether the backend's own report closes p to new
// admissions (Predicted only: under WorstCase what is held bounds what can
// be used).
func (s *Scheduler) gatedLocked(p *gpu) bool {
	h := s.set.policy.headroom
	return s.set.policy.predicted && h > 0 && p.report.known && float64(p.report.used) > (1-h)*float64(p.effective)
}

// committedLocked is what p has promised: under WorstCase the weight held,
// under Predicted the peak of its forecast (rounded up).
func (s *Scheduler) committedLocked(p *gpu) int64 {
	if !s.set.policy.predicted {
		return p.held
	}
	return int64(s.boundLocked(p) + 0.5)
}

// queueEffectiveLocked is the effective capacity of the queue's GPUs, for
// the Capacity of a refusal.
func (s *Scheduler) queueEffectiveLocked(q *queue) int64 {
	var e int64
	for _, r := range q.routes {
		e = satAdd64(e, r.p.effective)
	}
	return e
}

// holdLocked binds w's ticket to p, holding its weight.
func (s *Scheduler) holdLocked(w *waiter, p *gpu, waited time.Duration) *Ticket {
	t := w.t
	if t == nil {
		t = s.newTicketLocked()
		w.t = t
	}
	if t.s != s {
		t.s = s // never rewritten when a moved ticket binds again: see Ticket
	}
	t.binding = binding{gpu: p, line: w.line, tenant: w.tenant, weight: w.weight, charge: w.charge,
		opaque: w.opaque, pinned: w.pinned, noResume: w.noResume, lens: w.lens, waited: waited, seq: w.seq, affinity: w.affinity,
		class: w.line.name, queue: w.line.q.name, gpuName: p.name, guard: guardState{stopper: w.stop}}
	if len(w.shape) > 0 {
		if len(w.shape) == 1 {
			t.groups = t.oneGroup[:]
		} else {
			t.groups = make([]tgroup, len(w.shape))
		}
		median, known := 0, false
		if w.lens != nil {
			median, known = w.lens.Quantile(0.5)
		}
		for i, g := range w.shape {
			t.groups[i] = tgroup{Group: g, live: g.Seqs}
			t.groups[i].blk = t.groups[i].blocksAt(0)
			if !w.pinned && !w.opaque { // an opaque one reports no growth to judge
				judgeGroup(&t.groups[i], w.lens)
			}
			out := g.Cap
			if known {
				out = min(out, median)
			}
			t.predicted += out * g.Seqs
		}
	}
	if p.sharing {
		s.shareLocked(p, t, s.shareRunsLocked(p, w))
	}
	p.held = satAdd64(p.held, t.weight)
	if t.fixed() {
		p.fixedHeld = satAdd64(p.fixedHeld, t.weight)
	}
	p.charge = satAdd64(p.charge, t.charge)
	p.tickets++
	t.next = p.first
	if p.first != nil {
		p.first.prev = t
	}
	p.first = t
	w.line.held += t.weight
	w.tenant.holdLocked(p, t.charge, t.weight)
	s.guardSetLocked(p, t, s.guardNowLocked(t))
	s.forecastAddLocked(p, t)
	s.last.hold = p
	if p.tickets == 1 {
		p.drain.busy(s.clock.Now(), true)
	}
	return t
}

// unholdLocked unbinds t from its GPU; drained says whether the weight
// counts as released for the drain rate.
func (s *Scheduler) unholdLocked(t *Ticket, drained bool) {
	p := t.gpu
	s.forecastSubLocked(p, t)
	s.recycleCurveLocked(t)
	s.unshareLocked(p, t)
	p.held -= t.weight
	if t.fixed() {
		p.fixedHeld -= t.weight
	}
	p.charge -= t.charge
	p.tickets--
	if t.prev == nil {
		p.first = t.next
	} else {
		t.prev.next = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	}
	t.prev, t.next = nil, nil
	t.line.held -= t.weight
	t.tenant.unholdLocked(p, t.charge, t.weight)
	s.guardSetLocked(p, t, 0)
	p.preempting -= t.preempting
	t.preempting = 0
	t.guard = guardState{stopper: t.guard.stopper} // a moved ticket may be stopped again
	if drained {
		p.drain.add(t.charge, s.clock)
	}
	if p.tickets == 0 {
		p.drain.busy(s.clock.Now(), false)
	}
	t.weight, t.charge = 0, 0
	s.noteDemandLocked(p)
}

// ticketSlab is how many tickets one allocation makes.
const ticketSlab = 32

// newTicketLocked hands out a zero Ticket carved from a slab, so that the
// fast path allocates once per ticketSlab admissions. Tickets are never
// reused (a late second Release of a recycled ticket would free someone
// else's weight); a slab is freed by the GC once none of its tickets is
// referenced, so a long-lived ticket keeps at most one slab alive.
func (s *Scheduler) newTicketLocked() *Ticket {
	if len(s.slab) == 0 {
		s.slab = make([]Ticket, ticketSlab)
	}
	t := &s.slab[0]
	s.slab = s.slab[1:]
	return t
}

// Free is what a GPU could still take: its effective capacity minus what
// it has committed (negative after a shrink below it; 0 for an unknown
// GPU).
func (s *Scheduler) Free(gpu string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.gpuByName[gpu]
	if p == nil {
		return 0
	}
	return p.admitCap() - s.committedLocked(p)
}
