package admission

import (
	"hash/maphash"
	"math"
	"slices"
	"time"
)

// maxBackfillScan bounds how many waiters a dispatch pass looks at past the
// first one that did not fit: each look costs a forecast per GPU, and a
// request that deep in the queue is rarely the one that fits.
const maxBackfillScan = 256

type resKind uint8

const (
	resNone  resKind = iota
	resBlock         // strict order: nobody else may start on the GPU
	resEasy          // EASY backfilling: others may start if they do not delay head
)

// reservation is what the first waiter of a queue that did not fit anywhere
// holds on the GPU where it is expected to start first: at is that start,
// in steps from now (a step is one generated token per running sequence),
// and spare is the charge that will still be free then, after head. Another
// request may start on the GPU only if it is expected to finish before
// at, or if it fits in spare — so that, as far as the forecasts go, it does
// not delay head. A Block reservation lets nobody start.
type reservation struct {
	kind  resKind
	head  *waiter
	at    float64
	spare int64
}

// allowsLocked says whether w may start on p now without delaying the
// waiter p is reserved for; spare says it does so by taking spare room.
func (s *Scheduler) allowsLocked(p *gpu, w *waiter) (ok, spare bool) {
	r := &p.res
	if r.kind == resNone || r.head == w || r.head.state != waiting {
		return true, false
	}
	if r.kind == resBlock {
		return false, false
	}
	if rw := s.remainingLocked(w); rw < math.MaxInt32 && float64(rw) <= r.at {
		return true, false
	}
	// Still running when head starts: it must fit beside head then — in the
	// GPU, and under their tenant's cap if they share one.
	if t := w.tenant; t == r.head.tenant && t.share < 1 && t.heldOn(p)+r.head.charge+w.charge > t.capOn(p) {
		return false, false
	}
	return w.charge <= r.spare, true
}

// dispatchLocked admits every waiter that may go now and leaves on each GPU
// the reservation of the first waiter that may not (see doc.go, "Order").
//
// A grant changes the room and the reservations the waiters before it were
// judged by (a new ticket's release moves a head's expected start), so
// passes repeat until one grants nothing: the result does not depend on the
// order in which one pass happened to look.
func (s *Scheduler) dispatchLocked() {
	s.expireLimitsLocked()
	for {
		if _, granted := s.passLocked(false); granted == 0 {
			break
		}
	}
	s.checkLocked(opDispatch)
}

// passLocked is one dispatch pass. Classes go by priority; within a class
// the waiters of every queue go by arrival. A waiter over its tenant's cap
// on every GPU is passed over, and so are its tenant's later waiters in
// that queue. The first waiter of a queue that fits nowhere else reserves
// the GPU where it is expected to start first (or, without backfilling or
// once it is older than MaxHeadAge, blocks its queue and all its GPUs);
// those behind it may start only where that does not delay it.
//
// It returns how many waiters it granted. With dry set it grants nothing
// and returns the first waiter it would grant: tests check that a settled
// scheduler has none.
func (s *Scheduler) passLocked(dry bool) (grantable *waiter, granted int) {
	for _, p := range s.gpus {
		p.res = reservation{}
	}
	if s.queued == 0 {
		return nil, 0
	}
	s.pass++
	var now time.Time
	clock := func() time.Time {
		if now.IsZero() {
			now = s.clock.Now()
		}
		return now
	}
	scanned, blocked := 0, false
	if cap(s.cursors) < len(s.queues) {
		s.cursors = make([]*waiter, len(s.queues))
	}
	cursors := s.cursors[:len(s.queues)]
	defer clear(cursors) // no stale pointers kept alive
	for ci := range s.set.classes {
		for i, q := range s.queues {
			cursors[i] = q.lines[ci].head
		}
		for {
			// The oldest waiter of this class across queues still in play.
			k := -1
			for i, w := range cursors {
				if w != nil && s.queues[i].stopPass != s.pass && (k < 0 || w.seq < cursors[k].seq) {
					k = i
				}
			}
			if k < 0 {
				break
			}
			w := cursors[k]
			cursors[k] = w.next
			q := w.line.q
			if blocked {
				if scanned >= maxBackfillScan {
					return nil, granted
				}
				scanned++
			}
			if w.tenant.skippedIn(s.pass, q) {
				continue
			}
			if p, spare := s.pickLocked(w); p != nil {
				if dry {
					return w, 0
				}
				if spare {
					p.res.spare -= w.charge
				}
				s.grantLocked(w, p, clock(), blocked || p.res.kind != resNone)
				granted++
				continue
			}
			if !s.tenantRoomLocked(w) {
				w.tenant.skip(s.pass, q)
				continue
			}
			if p := s.preemptiveGPULocked(w, clock, !dry); p != nil {
				if dry {
					return w, 0
				}
				w.preemptive = true
				s.grantLocked(w, p, clock(), blocked || p.res.kind != resNone)
				granted++
				continue
			}
			blocked = true
			if q.resPass == s.pass {
				continue // only the first waiter of a queue holds a reservation
			}
			q.resPass = s.pass
			if !s.set.backfill || (s.set.maxHeadAge > 0 && clock().Sub(w.enqueued) >= s.set.maxHeadAge) {
				for _, r := range q.routes {
					if r.up && r.p.res.kind == resNone {
						r.p.res = reservation{kind: resBlock, head: w}
					}
				}
				q.stopPass = s.pass
				continue
			}
			if p, at, spare := s.shadowLocked(w); p != nil && p.res.kind == resNone {
				p.res = reservation{kind: resEasy, head: w, at: at, spare: spare}
			}
		}
	}
	return nil, granted
}

// eligible says whether w may be bound to the GPU of route r at all.
func eligible(w *waiter, r route) bool {
	return r.up && r.p.index >= 0 && r.p != w.exclude
}

var affinitySeed = maphash.MakeSeed()

// pickLocked chooses the GPU w starts on now, or nil: among the GPUs that
// have room for it (forecast, tenant cap, the backend's own report) and
// whose reservation allows it, the one w's Affinity prefers if any, else the
// one with the most room left after it. spare says the chosen GPU's
// reservation let it in on its spare room.
func (s *Scheduler) pickLocked(w *waiter) (best *gpu, spare bool) {
	s.runs.of = nil // what the views said at an earlier look no longer stands
	var bestRoom float64
	var pref *gpu
	var prefScore uint64
	if w.affinity != 0 {
		// Rendezvous hashing: the preferred GPU moves only when GPUs come
		// or go, and then only for the requests that preferred it.
		for _, r := range w.line.q.routes {
			if !eligible(w, r) {
				continue
			}
			if sc := maphash.Comparable(affinitySeed, struct {
				a uint64
				p string
			}{w.affinity, r.p.name}); pref == nil || sc > prefScore {
				pref, prefScore = r.p, sc
			}
		}
	}
	var c curve
	if s.set.policy.predicted {
		c = s.waiterCurveLocked(w)
	}
	// A request costs least where its prompt's leading blocks are held
	// already: among the GPUs with room, the one it adds the least to
	// comes first; then its affinity's; then the most room.
	var bestAdds int64
	prefFits, prefSpare := false, false
	// With a view of every candidate's cache, the cost in blocks decides
	// (cacheview.go); adds and affinity step aside.
	costs := s.cacheCostsLocked(w)
	var bestCost int64
	for _, r := range w.line.q.routes {
		p := r.p
		if !eligible(w, r) || !w.tenant.fitsOn(p, w.charge) {
			continue
		}
		room, adds, fits := s.fitsLocked(p, w, c, len(w.line.q.routes) > 1)
		if !fits {
			continue
		}
		ok, sp := s.allowsLocked(p, w)
		if !ok {
			continue
		}
		if p == pref {
			prefFits, prefSpare = true, sp
		}
		if costs != nil {
			c := costs[p.index]
			if best == nil || c < bestCost || c == bestCost && (p.held < best.held || p.held == best.held && room > bestRoom) {
				best, bestCost, bestRoom, spare = p, c, room, sp
			}
			continue
		}
		if best == nil || adds < bestAdds || adds == bestAdds && room > bestRoom {
			best, bestAdds, bestRoom, spare = p, adds, room, sp
		}
	}
	if costs == nil && prefFits && (w.shared == 0 || bestAdds == w.weight) {
		return pref, prefSpare
	}
	return best, spare
}

// tenantRoomLocked says whether w's tenant may take w's charge on one of
// its GPUs: otherwise it is the tenant's cap, not the GPUs, that holds w.
func (s *Scheduler) tenantRoomLocked(w *waiter) bool {
	for _, r := range w.line.q.routes {
		if eligible(w, r) && w.tenant.fitsOn(r.p, w.charge) {
			return true
		}
	}
	return false
}

// shadowLocked is where and when head is expected to start: on each of
// its GPUs, the step at which enough of the running requests are expected
// to have finished for its charge to fit, and the charge spare then; the
// earliest wins. Running requests release at their median remaining length
// (their cap under WorstCase).
func (s *Scheduler) shadowLocked(head *waiter) (best *gpu, at float64, spare int64) {
	type release struct {
		at     int
		charge int64
	}
	var rs []release
	for _, r := range head.line.q.routes {
		p := r.p
		if !eligible(head, r) {
			continue
		}
		free := p.admitCap() - p.charge
		rs = rs[:0]
		for t := p.first; t != nil; t = t.next {
			rs = append(rs, release{s.ticketRemainingLocked(t), t.charge})
		}
		slices.SortFunc(rs, func(a, b release) int { return a.at - b.at })
		when := 0
		for i := 0; free < head.charge && i < len(rs); i++ {
			free += rs[i].charge
			when = rs[i].at
		}
		if free < head.charge {
			continue // not even with everything released (a shrunk GPU): no reservation here
		}
		if best == nil || float64(when) < at {
			best, at, spare = p, float64(when), free-head.charge
		}
	}
	return best, at, spare
}

// needLocked is how much charge must drain from w's GPUs before w can be
// admitted: what it and the waiters ahead of it lack of the room left, or
// of its tenant's caps, whichever is more. arriving counts its whole line
// as ahead of it.
func (s *Scheduler) needLocked(w *waiter, arriving bool) int64 {
	q, t := w.line.q, w.tenant
	var ahead, tAhead int64
	for i := 0; i <= w.line.index && i < len(q.lines); i++ {
		l := q.lines[i]
		for x := l.head; x != nil; x = x.next {
			if l == w.line && !arriving && x.seq >= w.seq {
				break
			}
			if x == w {
				continue
			}
			ahead += x.charge
			if x.tenant == t {
				tAhead += x.charge
			}
		}
	}
	var room, tHeld, tCap int64
	for _, r := range q.routes {
		if !eligible(w, r) {
			continue
		}
		room += max(0, r.p.admitCap()-s.committedLocked(r.p))
		tHeld += t.heldOn(r.p)
		tCap += t.capOn(r.p)
	}
	need := ahead + w.charge - room
	if t.share < 1 {
		need = max(need, tHeld+tAhead+w.charge-tCap)
	}
	return need
}

// expectedWaitLocked is the time for need to drain from w's GPUs at their
// measured rates; known is false until they have seen enough releases
// (then nobody is shed early: a cold start is not evidence of a long wait).
func (s *Scheduler) expectedWaitLocked(now time.Time, w *waiter, need int64) (time.Duration, bool) {
	var rate float64
	releases := 0
	for _, r := range w.line.q.routes {
		if !eligible(w, r) {
			continue
		}
		rt, n := r.p.drain.rate(now)
		rate += rt
		releases += n
	}
	if releases < minDrainReleases || rate <= 0 {
		return 0, false
	}
	if need <= 0 {
		return 0, true
	}
	secs := float64(need) / rate
	if secs > float64(math.MaxInt64/int64(time.Second)) {
		return math.MaxInt64, true
	}
	return time.Duration(math.Ceil(secs * float64(time.Second))), true
}

// maxPromises bounds a queue's list of outstanding Retry-After promises.
const maxPromises = 4096

// retryLocked is the RetryAfter of a refusal of w, which lacks need: the
// expected time for need — plus the charge of the refusals already told to
// come back before it — to drain, jittered by ±10% so that a burst refused
// together does not return together, never below MinRetryAfter nor above
// MaxRetryAfter or the class's queue timeout. Without a measurement it is
// between one and two seconds: soon enough not to leave the GPU idle,
// spread enough not to return as one wave.
func (s *Scheduler) retryLocked(now time.Time, w *waiter, need int64) time.Duration {
	q := w.line.q
	est, known := s.expectedWaitLocked(now, w, need+q.promised.outstanding(now))
	if known {
		est = time.Duration(float64(est) * (0.9 + 0.2*s.rng.Float64()))
	} else {
		est = MinRetryAfter + time.Duration(s.rng.Int64N(int64(time.Second)))
	}
	top := s.set.maxRetryAfter
	if to := w.line.spec.timeout; to > 0 && to < top {
		top = max(to, MinRetryAfter)
	}
	est = min(max(est, MinRetryAfter), top)
	q.promised.add(promise{due: now.Add(est), charge: w.charge})
	return est
}
