package admission

import (
	"math"
	"time"

	"github.com/kvgate/kvgate/admission/predict"
)

// The change detector: it distrusts a forecast that has become dangerous,
// before the guard runs out of room — not one the traffic merely moved
// away from. Three choices make it judge danger rather than change:
//
//   - Each sequence is judged against the forecast it was admitted on: its
//     tenant's own lengths, or its class's, or the queue's (the order
//     lengthsForLocked picks them in), so that tenants or classes with
//     different lengths sharing a queue are not a shift, and one joining,
//     leaving or changing its share of the traffic moves nothing.
//   - A crossing counts for what it costs: each block a sequence grows past
//     its mark (its predictor's 0.9 quantile) adds its bytes divided by the
//     room the guard still has on its GPU (its capacity less what every
//     ticket may hold now, never taken below capacity/driftRoomFloor); each
//     sequence that finishes takes away driftAllowance times the growth past
//     the mark its forecast expected, over the same room. That is a CUSUM
//     whose steps are the forecast's error in bytes, weighed by how near the
//     guard is to acting: on a right forecast it drifts down (a sequence
//     grows past its 0.9 quantile by half of what the allowance forgives),
//     a mark crossed by a few answers on a GPU with room moves it little,
//     and outputs turning shorter cross less and can only take it down.
//     It trips at driftTrip: the growth past the forecast, net of the
//     allowance, has taken that part of the guard's room.
//   - The consequence is proportionate: what trips is the scope whose
//     forecast was wrong — a named tenant (judged against its own lengths
//     or, before it has enough, the queue's), or a class (judged against
//     its own, or the anonymous traffic of a class before it has enough).
//     Only its requests go to their worst case for the cool-down and only
//     its own lengths start over; the rest of the queue is forecast as
//     before. The anonymous traffic of a queue of one class has the
//     queue's lengths as its own, so its trip distrusts the queue. The guard
//     (a stop that cuts a request) and an overflow still distrust the
//     whole queue: they are the evidence that scoping was not enough. A
//     stop of streams that will be resumed does not: their looser bound
//     (ResumableEpsilon) prices it in, and whether the forecast was wrong
//     is this detector's to judge.
//
// Why the floor is a quarter of the capacity: a GPU the forecast packs
// leaves the guard a few percent of room by design, with the tail the
// forecast expects already priced in; weighed against that alone (floors
// of 1/32 and 1/8 were tried), three long answers of a steady lognormal
// mix overlapping tripped it. A shift to long answers still trips within a
// few blocks of every sequence passing its mark.
//
// A sequence still running when its predictor warmed up, or forecast only
// from the middle of its life, is no part of it (it was picked by its
// survival); neither is one the guard stopped.
const (
	driftTrip      = 1.0
	driftAllowance = 2.0
	driftRoomFloor = 4
	// maxScopes bounds the detectors a queue keeps for its tenants and
	// classes; past it a scope is judged as the queue's anonymous traffic.
	maxScopes = 2 * maxTenantLengths
)

// scopeKind says whose forecast a detector judges.
type scopeKind uint8

const (
	scopeTenant scopeKind = iota // a tenant of the queue; "" is its anonymous traffic
	scopeClass                   // a class of the queue, judged on its own lengths
)

// scopeKey names a detector of a queue.
type scopeKey struct {
	kind scopeKind
	name string
}

// trustState is a change detector and its cool-down.
type trustState struct {
	score float64   // the CUSUM: net growth past the forecast, in parts of the guard's room
	until time.Time // end of the cool-down; zero while the forecast is trusted
}

// cooling says whether the cool-down runs at now, ending it when it has
// run out.
func (tr *trustState) cooling(now time.Time) bool {
	if tr.until.IsZero() {
		return false
	}
	if now.Before(tr.until) {
		return true
	}
	tr.until = time.Time{}
	return false
}

// admittedOnGuess says whether t was admitted on a forecast that can be
// wrong, or is forecast so now: one whose tenant's or class's forecast was
// distrusted since is held at its worst case, but the guard still stops it
// before one that was never a guess.
func (t *Ticket) admittedOnGuess() bool {
	return t.guessed() || (len(t.groups) > 0 && t.groups[0].judged)
}

// judgeGroup sets g's mark and allowance for a forecast from lens (nil:
// not judged).
func judgeGroup(g *tgroup, lens *predict.Lengths) {
	g.judged, g.mark, g.markBlk, g.allow, g.over = false, math.MaxInt, 0, 0, 0
	if lens == nil {
		return
	}
	g.judged = true
	n, ok := lens.Quantile(0.9)
	if !ok || n >= g.Cap {
		return // nothing past the mark: the forecast runs to the cap
	}
	g.mark, g.markBlk = n, g.blocksAt(n)
	// The expected growth past the mark, in blocks: tokens over the block
	// size, plus the block a crossing sequence enters at once.
	excess := lens.MeanExcess(n, g.Cap)
	g.allow = driftAllowance * (excess/float64(g.BlockTokens) + lens.Survival(n)) * float64(g.BlockBytes)
}

// scopeOfLocked is the detector that judges t: its class's when it was
// forecast from the class's own lengths, or when it is anonymous traffic of
// a queue of several classes; else its tenant's.
func (s *Scheduler) scopeOfLocked(t *Ticket) scopeKey {
	q := t.line.q
	if l := q.byClass[t.line.name]; l != nil && l == t.lens && q.byTenant[t.tenant.name] != l {
		return scopeKey{scopeClass, t.line.name}
	}
	if t.tenant.name == "" && len(q.byClass) > 1 {
		return scopeKey{scopeClass, t.line.name}
	}
	return scopeKey{scopeTenant, t.tenant.name}
}

// detectorLocked is q's detector for k, made on first use (nil when q has
// as many as it keeps).
func (q *queue) detectorLocked(k scopeKey) *trustState {
	tr := q.scopes[k]
	if tr == nil && len(q.scopes) < maxScopes {
		if q.scopes == nil {
			q.scopes = map[scopeKey]*trustState{}
		}
		tr = &trustState{}
		q.scopes[k] = tr
	}
	return tr
}

// driftRoomLocked is the room the guard still has on p, as the detector
// weighs it.
func driftRoomLocked(p *gpu) float64 {
	line := p.guardLine()
	return float64(max(line-(p.now-p.stopping), line/driftRoomFloor, 1))
}

// noteGrowthLocked feeds the detector the blocks g's sequences have grown
// past their mark since it last looked (Progress).
func (s *Scheduler) noteGrowthLocked(t *Ticket, g *tgroup) {
	if !g.judged || !t.guessed() || t.guard.stopped || g.blk <= g.markBlk+g.over || g.markBlk == 0 {
		return
	}
	grown := g.blk - g.markBlk - g.over
	g.over += grown
	s.scoreLocked(t, float64(grown)*float64(g.live)*float64(g.BlockBytes))
}

// noteFinishLocked feeds the detector one finished sequence of g (Done):
// the allowance its forecast makes for growth past the mark.
func (s *Scheduler) noteFinishLocked(t *Ticket, g *tgroup) {
	if !g.judged || !t.guessed() || t.guard.stopped || g.allow == 0 {
		return
	}
	s.scoreLocked(t, -g.allow)
}

// scoreLocked moves t's detector by bytes past its forecast (negative: an
// allowance) over its GPU's room, and trips it at driftTrip.
func (s *Scheduler) scoreLocked(t *Ticket, bytes float64) {
	q := t.line.q
	k := s.scopeOfLocked(t)
	tr := q.detectorLocked(k)
	if tr == nil {
		tr, k = q.detectorLocked(scopeKey{scopeTenant, ""}), scopeKey{scopeTenant, ""}
		if tr == nil {
			tr = &q.trust
		}
	}
	tr.score = max(tr.score+bytes/driftRoomLocked(t.gpu), 0)
	if tr.score >= driftTrip {
		tr.score = 0
		s.distrustScopeLocked(q, k, TripDrift)
	}
}

// distrustScopeLocked distrusts the forecast of k in q for the cool-down:
// its requests, running ones too, go to their worst case and its own
// lengths start over. The anonymous tenant's lengths are the queue's: its
// trip distrusts the queue.
func (s *Scheduler) distrustScopeLocked(q *queue, k scopeKey, reason string) {
	if k.kind == scopeTenant && k.name == "" {
		s.distrustLocked(q, reason)
		return
	}
	if !s.set.policy.predicted {
		return
	}
	tr := q.detectorLocked(k)
	if tr == nil {
		s.distrustLocked(q, reason)
		return
	}
	now := s.clock.Now()
	until := now.Add(max(s.set.policy.coolDown, 0))
	if tr.cooling(now) {
		tr.until = until
		return
	}
	s.stops.trips[reason]++
	s.stops.scopeTrips[k.kind]++
	tr.until = until
	switch k.kind {
	case scopeTenant:
		delete(q.byTenant, k.name)
		delete(q.warmScopes, k)
	case scopeClass:
		delete(q.byClass, k.name)
		delete(q.warmScopes, k)
	}
	s.fw.scratchSeq = 0
	for _, r := range q.routes {
		for t := r.p.first; t != nil; t = t.next {
			if t.line.q != q || !t.guessed() {
				continue
			}
			if (k.kind == scopeTenant && t.tenant.name == k.name) || (k.kind == scopeClass && t.line.name == k.name) {
				s.updateLocked(t, func() { t.lens = nil })
			}
		}
	}
}

// distrustLocked holds q's requests at their worst case for the
// cool-down, those running too, and starts its learning over; during a
// cool-down it starts the cool-down again.
func (s *Scheduler) distrustLocked(q *queue, reason string) {
	if !s.set.policy.predicted {
		return
	}
	q.trust.score = 0
	until := s.clock.Now().Add(max(s.set.policy.coolDown, 0))
	if !s.trustedLocked(q) {
		// Still cooling down: the evidence since the last trip (the
		// censored lengths of what was stopped) is the new traffic's,
		// and is kept; only the cool-down starts again.
		q.trust.until = until
		return
	}
	s.stops.trips[reason]++
	if reason == TripDrift {
		s.stops.scopeTrips[scopeQueueIndex]++
	}
	q.trust.until = until
	if l, err := predict.NewLengths(predict.LengthsConfig{MaxLen: q.spec.maxLen}); err == nil {
		q.resetLengths(l)
		if q.tally != nil {
			// The fleet's deltas stay in the new layout's terms (the same
			// one): nothing to start over there.
			q.tally = q.lengths.NewTally()
			q.tallyTenants, q.tallyClasses = map[string]*predict.Tally{}, map[string]*predict.Tally{}
		}
	}
	q.scopes = nil // every scope's evidence was of the forecast that just went
	s.fw.scratchSeq = 0
	for _, r := range q.routes {
		for t := r.p.first; t != nil; t = t.next {
			if t.line.q == q && t.guessed() {
				s.updateLocked(t, func() { t.lens = nil })
			}
		}
	}
}

// trustedLocked says whether q's forecast may be used now, ending its
// cool-down when it has run out.
func (s *Scheduler) trustedLocked(q *queue) bool { return !q.trust.cooling(s.clock.Now()) }

// scopeTrustedLocked says whether the forecast of k in q may be used now.
func (s *Scheduler) scopeTrustedLocked(q *queue, k scopeKey) bool {
	tr := q.scopes[k]
	return tr == nil || !tr.cooling(s.clock.Now())
}

// Scope names of Stats().DriftTrips.
const (
	DriftQueue  = "queue"  // a queue's anonymous traffic, or a scope past maxScopes: the whole queue
	DriftTenant = "tenant" // one tenant of a queue
	DriftClass  = "class"  // one class of a queue
)

// scopeQueueIndex is the queue's slot in Scheduler.scopeTrips, after the
// scope kinds.
const scopeQueueIndex = scopeClass + 1

// driftTripsLocked is s.stops.scopeTrips by name.
func (s *Scheduler) driftTripsLocked() map[string]int64 {
	return map[string]int64{DriftTenant: s.stops.scopeTrips[scopeTenant], DriftClass: s.stops.scopeTrips[scopeClass], DriftQueue: s.stops.scopeTrips[scopeQueueIndex]}
}
