package admission

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

// preemptiveGPULocked is the GPU where w may start preemptively now, or
// nil.
func (s *Scheduler) preemptiveGPULocked(w *waiter) *gpu {
	if !s.set.preemption || !s.set.policy.predicted || w.line.index >= len(w.line.q.lines)-1 {
		return nil // nothing lies below the lowest class
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
	s.lastPreemptive = w.preemptive
	if !w.preemptive {
		return
	}
	t.preempting = t.weight
	t.gpu.preempting += t.preempting
	s.preemptive++
}
