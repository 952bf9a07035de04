package admission

import "time"

// Preemption of lower classes: a request of a higher class that fits no
// GPU on the forecast may start on room that running streams of lower
// classes hold, instead of waiting for them to finish; when the batch's
// growth then meets the GPU's line, the guard stops those streams
// (resumable first, lowest class first), as vLLM's priority scheduling
// preempts on its own GPU. Their clients see a pause and a recompute,
// never an error.
//
// A request is admitted so only where three things hold, so that nothing
// can overflow and nothing but a lower class's pause pays for it:
//   - its worst case fits beside what every ticket of the GPU may hold on
//     the backend now (the guard's now, less what is being stopped), within
//     what the GPU admits, and beside the worst cases the exposure bound
//     allows;
//   - the streams of lower classes that the guard can stop and resume hold,
//     now, at least the worst cases of every request running preemptively
//     there, this one included: what it may come to take, the guard can
//     take back from them;
//   - the GPU is not a lease of a budget shared with other replicas: a
//     lease is a hard limit, whose overrun the guard does not watch.
//
// Its forecast then counts like any ticket's, so that lower classes wait
// until the room is theirs again.
//
// A waiter first waits PreemptionConfig.After for room to free on its own:
// in a busy pool most waits end within a release or two, while each
// preemptive start may cost a lower class's stream a stop and a recompute.
// A dispatch pass is due when it will have waited that long, whatever else
// happens meanwhile.

// preemptiveGPULocked is the GPU where w may start preemptively now, or
// nil. A waiter that has not yet waited PreemptionConfig.After may not:
// with arm set, a dispatch pass is then due when it will have.
func (s *Scheduler) preemptiveGPULocked(w *waiter, now func() time.Time, arm bool) *gpu {
	if !s.set.preemption || !s.set.policy.predicted || w.line.index >= len(w.line.q.lines)-1 {
		return nil // nothing lies below the lowest class
	}
	if s.set.preemptAfter > 0 {
		if at := w.enqueued.Add(s.set.preemptAfter); now().Before(at) {
			if arm {
				s.preemptDueLocked(at, now())
			}
			return nil
		}
	}
	for _, r := range w.line.q.routes {
		p := r.p
		if !eligible(w, r) || p.limited || !w.tenant.fitsOn(p, w.charge) {
			continue
		}
		if ok, _ := s.allowsLocked(p, w); !ok || s.gatedLocked(p) || !s.exposureFitsLocked(p, w) {
			continue
		}
		if satAdd64(p.now-p.stopping, w.weight) > p.admitCap() {
			continue
		}
		if s.stoppableBelowLocked(p, w.line.index) < satAdd64(p.preempting, w.weight) {
			continue
		}
		return p
	}
	return nil
}

// preemptBook is the scheduler's part in preemption: how many waiters
// started preemptively, and the dispatch pass due when the first waiter
// still short of PreemptionConfig.After will have waited it.
type preemptBook struct {
	admitted int64
	timer    Timer // nil: none armed
	at       time.Time
	gen      uint64 // which arming is current: a timer replaced as it fired clears nothing
}

// preemptDueLocked makes sure a dispatch pass runs at at (now is the
// clock's now): an armed pass due no later stays.
func (s *Scheduler) preemptDueLocked(at, now time.Time) {
	pt := &s.preempt
	if pt.timer != nil {
		if !at.Before(pt.at) {
			return
		}
		pt.timer.Stop()
	}
	pt.gen++
	gen := pt.gen
	pt.at = at
	pt.timer = s.clock.AfterFunc(at.Sub(now), func() {
		s.mu.Lock()
		if pt.gen == gen {
			pt.timer = nil
		}
		s.settleUnlock(opPreempt)
	})
}

// stoppableBelowLocked is what the streams of p of classes below index
// that the guard can stop and resume hold now.
func (s *Scheduler) stoppableBelowLocked(p *gpu, index int) int64 {
	var n int64
	for t := p.first; t != nil; t = t.next {
		if t.line.index > index && t.guard.stopper != nil && !t.guard.stopped && !t.guard.lingering && t.resumable() {
			n += t.guard.now
		}
	}
	return n
}

// holdPreemptiveLocked notes that t, just held for w, started
// preemptively: its worst case counts in its GPU's preempting until it is
// released.
func (s *Scheduler) holdPreemptiveLocked(w *waiter, t *Ticket) {
	s.last.preemptive = w.preemptive
	if !w.preemptive {
		return
	}
	t.preempting = t.weight
	t.gpu.preempting += t.preempting
	s.preempt.admitted++
}
