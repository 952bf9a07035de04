package admission

import (
	"slices"
	"time"
)

// The guard: what keeps a GPU inside its capacity when the forecast is
// wrong (see doc.go, "When the forecast is wrong").
//
// A forecast bounds overflow only while traffic looks like its history.
// Four things hold whatever the traffic does:
//
//   - What each ticket may hold on the backend now is known: for a request
//     that reports its progress, its prompt and what it has generated plus
//     the forecast's lead and the next block (what the backend may have
//     taken before the gateway sees it, and will take before the next
//     report); for any other, its worst case, since nothing bounds it
//     better. A GPU's now is their sum. When a Progress takes it past the
//     GPU's capacity (guardLine), the scheduler stops running requests — those that can be
//     resumed first (ResumableStopper), then predicted ones, lowest class first, then the tenant holding the most for its
//     share, then the newest — until what is left fits, through their
//     Stopper, before the backend has to fail them all. A stopped request
//     still holds until it is released: its blocks are the backend's until
//     it notices the abort.
//   - Exposure is bounded before anything is learned: the worst cases a
//     GPU holds never sum past MaxOvercommit × its capacity, nor a
//     tenant's past that times its share.
//   - A forecast is distrusted, for CoolDown, when it is shown wrong: a
//     tenant's or a class's by the change detector (drift.go), when its
//     sequences outgrew it by more than the guard's room allows; a queue's
//     by a stop by the guard that cuts a request, or an overflow a backend
//     reports (Overflowed). A stop of streams that will be resumed alone
//     distrusts nothing: they were admitted on a looser bound
//     (ResumableEpsilon) that prices such stops in. A distrusted
//     forecast's requests are then held at their worst case —
//     those running too — and their learned lengths start over, so that
//     warm-up follows on the new traffic.
//   - Every request teaches: one released before its sequences finished
//     (an abort, a failure, a stop) is a censored sample at the length it
//     reached.

// Stopper stops a running request: the caller ends its stream and closes
// its exchange with the backend, then releases (or lingers) its ticket. It
// is called once, after the scheduler's lock is released, from the
// goroutine whose progress report found the GPU over its line, so it must
// return at once.
type Stopper interface{ StopForMemory() }

// ResumableStopper is a Stopper whose request can be resumed once
// stopped, while Resumable says so (what a stream has generated may take
// that away: a tool call, a model's reasoning). The guard stops such
// requests before any other: their clients see a pause where the others'
// see an error. Resumable is called under the scheduler's lock and must
// return at once.
type ResumableStopper interface {
	Stopper
	Resumable() bool
}

// resumable says whether the guard may stop t expecting it to be resumed.
func (t *Ticket) resumable() bool { return canResume(t.noResume, t.guard.stopper) }

// canResume says whether a request stopped through st can be resumed.
func canResume(noResume bool, st Stopper) bool {
	if noResume {
		return false
	}
	rs, ok := st.(ResumableStopper)
	return ok && rs.Resumable()
}

// resumable says whether the guard could stop w, once admitted, expecting
// it to be resumed.
func (w *waiter) resumable() bool { return canResume(w.noResume, w.stop) }

// guardState is a ticket's part of its GPU's now.
type guardState struct {
	now       int64 // what it may hold on the backend now, in bytes
	stopper   Stopper
	stopped   bool // the guard stopped it: its now counts in the GPU's stopping
	lingering bool // given up, held until the backend has let its blocks go
}

// predictable says whether a request may be forecast from its queue's
// learned lengths: it reports progress and does not set its own length.
func (w *waiter) predictable() bool { return !w.opaque && !w.pinned && len(w.shape) > 0 }

// certainGrowth says whether a request's growth is known without a
// forecast: it sets its own length (ignore_eos, min_tokens, or a stream
// resumed at its worst case) and reports its progress, so that every
// sequence is taken to run to its cap — the most it can hold at every step,
// as worst_case holds it at its end, but growing as it really grows, so
// that the batch's peak counts the requests that finish first.
func (w *waiter) certainGrowth() bool { return !w.opaque && w.pinned && len(w.shape) > 0 }

// guessed says whether t's growth is a forecast from learned lengths that
// can be wrong, rather than certain or its worst case.
func (t *Ticket) guessed() bool { return t.lens != nil && !t.pinned }

// guardNowLocked is what t may hold on the backend now.
func (s *Scheduler) guardNowLocked(t *Ticket) int64 {
	switch {
	case t.guard.lingering:
		return t.guard.now // it grows no more
	case t.opaque || len(t.groups) == 0:
		return t.weight
	}
	var n int64
	for i := range t.groups {
		g := &t.groups[i]
		// As the forecast's step 0: the block after the one it last
		// entered, which it takes within a block's tokens of the report
		// that entered that one; so a stop decided when this passes the
		// line has those tokens' time to take effect.
		n = satAdd64(n, g.size(g.live, min(satAdd(g.gen, forecastLead(g.Group)+1), g.Cap)))
	}
	return min(n, t.weight)
}

// guardSetLocked makes t's now its current value, moving its GPU's sums.
func (s *Scheduler) guardSetLocked(p *gpu, t *Ticket, now int64) {
	d := now - t.guard.now
	p.now += d
	if t.guard.stopped {
		p.stopping += d
	}
	t.guard.now = now
}

// Holding is what the tickets admitted to GPU may hold on its backend at
// this moment (the guard's now: GPUStats.Now), a bound that cannot be
// below the truth, and how many they are; 0, 0 for a GPU it does not
// know. A fleet publishes them with its lease.
func (s *Scheduler) Holding(gpu string) (bytes int64, tickets int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.gpuByName[gpu]
	if p == nil {
		p = s.retired[gpu]
	}
	if p == nil {
		return 0, 0
	}
	return p.now, p.tickets
}

// guardLine is the most p may hold on its backend: its capacity. The AIMD
// loop's effective capacity is not it (a shrink revokes nothing), nor is a
// lease of a GPU shared with other replicas: a lease that falls (Redis
// lost, the fleet's shares moved) stops admissions, and stopping running
// requests for it is the lease protocol's business, not the guard's.
func (p *gpu) guardLine() int64 { return p.nominal }

// exposureLine is the capacity the exposure bound multiplies: the GPU's,
// or its lease.
func (p *gpu) exposureLine() int64 {
	if p.limited {
		return min(p.nominal, max(p.limit, 0))
	}
	return p.nominal
}

// guardCheckLocked stops running requests on p until what the others may
// hold fits its line (Predicted only: under WorstCase what is held bounds
// it already).
func (s *Scheduler) guardCheckLocked(p *gpu) {
	if !s.set.policy.predicted || s.stops.inGuard {
		return
	}
	excess := p.now - p.stopping - p.guardLine()
	if excess <= 0 {
		return
	}
	s.stops.inGuard = true
	defer func() { s.stops.inGuard = false }()
	var victims []*Ticket
	for t := p.first; t != nil; t = t.next {
		if t.guard.stopper != nil && !t.guard.stopped && !t.guard.lingering && t.guard.now > 0 {
			victims = append(victims, t)
		}
	}
	if len(victims) == 0 {
		return
	}
	nowOf := map[*tenantState]int64{}
	for t := p.first; t != nil; t = t.next {
		nowOf[t.tenant] += t.guard.now - stoppingPart(t)
	}
	weigh := func(t *Ticket) float64 { return float64(nowOf[t.tenant]) / max(t.tenant.share, 1e-9) }
	resumable := make(map[*Ticket]bool, len(victims))
	for _, t := range victims {
		resumable[t] = t.resumable()
	}
	slices.SortFunc(victims, func(a, b *Ticket) int {
		switch {
		case resumable[a] != resumable[b]: // what can be resumed first: a pause, not an error
			if resumable[a] {
				return -1
			}
			return 1
		case a.admittedOnGuess() != b.admittedOnGuess(): // predicted first: their growth was a guess
			if a.admittedOnGuess() {
				return -1
			}
			return 1
		case a.line.index != b.line.index: // lowest priority first
			return b.line.index - a.line.index
		case a.tenant != b.tenant && weigh(a) != weigh(b): // the tenant most over its share
			if weigh(a) > weigh(b) {
				return -1
			}
			return 1
		default: // the newest
			return int(int64(b.seq) - int64(a.seq))
		}
	})
	// A stop of streams that will be resumed is what their looser bound
	// (ResumableEpsilon) prices in: it distrusts nothing, and a forecast
	// they outgrew is the change detector's to judge. One that cuts a
	// stream is the evidence that the forecast was wrong: it distrusts
	// the queue.
	q := map[*queue]bool{}
	for _, t := range victims {
		if excess <= 0 {
			break
		}
		t.guard.stopped = true
		p.stopping += t.guard.now
		excess -= t.guard.now
		s.stops.guardStops++
		s.stops.pending = append(s.stops.pending, t.guard.stopper)
		if !resumable[t] {
			q[t.line.q] = true
		}
	}
	for x := range q {
		s.distrustLocked(x, TripGuard)
	}
}

// stoppingPart is what of t's now its GPU counts as stopping.
func stoppingPart(t *Ticket) int64 {
	if t.guard.stopped {
		return t.guard.now
	}
	return 0
}

// Why a queue's forecast was distrusted (Stats().Trips, Overflowed).
const (
	TripDrift    = "drift"    // the change detector: sequences outlive their forecast
	TripGuard    = "guard"    // the guard had to stop a request
	TripOverflow = "overflow" // a backend ran out of KV blocks (an out-of-memory error, preemptions)
)

// Overflowed tells the scheduler that a backend of GPU ran out of KV
// memory (it answered with an out-of-memory error, or its preemptions
// rose): the forecast of every queue served there is distrusted for the
// cool-down. Unknown GPUs are ignored.
func (s *Scheduler) Overflowed(gpu string) {
	s.mu.Lock()
	if p := s.gpuByName[gpu]; p != nil {
		for _, q := range s.queues {
			for _, r := range q.routes {
				if r.p == p {
					s.distrustLocked(q, TripOverflow)
				}
			}
		}
	}
	s.settleUnlock(opFeedback)
}

// fixed says whether t holds what the guard cannot take back without
// failing it: it cannot be resumed (NoResume), or cannot be stopped at all
// (no Stopper: a request that reports no progress).
func (t *Ticket) fixed() bool { return t.noResume || t.guard.stopper == nil }

// exposureFitsLocked says whether w's worst case fits beside the worst
// cases p and its tenant hold within MaxOvercommit (Predicted only), and,
// for a request that cannot be resumed, beside the worst cases of every
// such request and every one that cannot be stopped within the GPU's
// line: whatever the traffic does then, stopping the streams that can be
// resumed (the guard's first victims) is enough, and none that cannot is
// ever stopped. It costs such traffic what worst_case would; a forecast
// cannot buy it more, since a shift it does not foresee would have the
// guard fail it.
func (s *Scheduler) exposureFitsLocked(p *gpu, w *waiter) bool {
	line := float64(p.exposureLine()) * s.set.policy.overcommit
	if float64(satAdd64(p.held, w.weight)) > line {
		return false
	}
	if w.noResume && satAdd64(p.fixedHeld, w.weight) > p.guardLine() {
		return false
	}
	t := w.tenant
	return t.share >= 1 || float64(satAdd64(t.worstOn(p), w.weight)) <= line*t.share
}

// Linger gives the ticket up but keeps what it holds now for d: a request
// whose client left, or that was stopped or timed out, still has blocks on
// the backend until it notices the abort, and memory it holds is no room
// for another. Its forecast no longer grows; Release (at d, or earlier by
// the caller) gives everything back. d <= 0 releases at once.
func (t *Ticket) Linger(d time.Duration) {
	if t == nil || t.s == nil {
		return
	}
	if d <= 0 {
		t.Release()
		return
	}
	s := t.s
	s.mu.Lock()
	if t.weight == 0 || t.guard.lingering {
		s.mu.Unlock()
		return
	}
	t.guard.lingering = true
	s.clock.AfterFunc(d, t.Release)
	s.mu.Unlock()
}

// censorLocked teaches t's queue that its live sequences ran at least as
// long as they got: a request given up before they finished. Opaque and
// pinned requests teach nothing (an opaque one's progress is not known).
func (s *Scheduler) censorLocked(t *Ticket) {
	if t.opaque || t.pinned {
		return
	}
	for i := range t.groups {
		g := &t.groups[i]
		for range g.live {
			if g.gen > 0 {
				s.observeLocked(t.line.q, t.tenant.name, t.line.name, g.gen, true)
			}
		}
	}
}

// flushStops calls the Stoppers the guard chose; mu must not be held.
func flushStops(stops []Stopper) {
	for _, st := range stops {
		st.StopForMemory()
	}
}
