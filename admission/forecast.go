package admission

import (
	"math"

	"github.com/kvgate/kvgate/admission/predict"
	"github.com/kvgate/kvgate/kvbudget"
)

// The Predicted policy: how a request's hold is forecast (see doc.go).
//
// A GPU's forecast fc is Σ over its tickets of each ticket's own curve
// (mean and variance of its bytes at every point of predict's grid of
// future steps), kept incrementally: a ticket keeps the curve it added, so
// that taking it away is exact whatever its predictor learned since. A
// candidate fits a GPU while the peak of fc + its curve, at z standard
// deviations (z from Policy.Epsilon), stays within the effective capacity.

// curve is a forecast over predict's grid: at each point the mean and
// variance of the bytes held, and hi, what they would be if every request
// still running were alive (none finishing before its cap): a hard bound
// that the normal bound, with few large requests, can exceed. set says it
// has been added to its GPU's (tickets only). Every point from n on is
// zero: a request has ended by some point of the grid (a short one within
// its first few), and what is added, taken away, copied or searched stops
// there. Zeros added are exact, so the extent changes no sum.
//
// flat is added to every point of the grid, from n on too. A request
// without a predictor, or an opaque one, is held the same at every step:
// kept apart, its curve costs nothing per point to make, add, take away or
// search, where spelled out over the grid it was most of an admission's
// work for a non-streamed request.
type curve struct {
	mean, vari, hi []float64
	n              int
	flat           point
	set            bool
}

// point is a curve's value at one step.
type point struct{ mean, vari, hi float64 }

func (p *point) add(o point, sign float64) {
	p.mean += sign * o.mean
	p.vari += sign * o.vari
	p.hi += sign * o.hi
}

// at is c's value at point k.
func (c *curve) at(k int) point {
	p := c.flat
	if k < c.n {
		p.add(point{c.mean[k], c.vari[k], c.hi[k]}, 1)
	}
	return p
}

func newCurve() curve {
	return curve{mean: make([]float64, predict.GridLen), vari: make([]float64, predict.GridLen), hi: make([]float64, predict.GridLen)}
}

func (c *curve) zero() {
	clear(c.mean[:c.n])
	clear(c.vari[:c.n])
	clear(c.hi[:c.n])
	c.n = 0
	c.flat = point{}
}

// extend notes that points below n may now be non-zero.
func (c *curve) extend(n int) { c.n = max(c.n, n) }

func (c *curve) add(o curve, sign float64) {
	n := o.n
	mean, vari, hi := c.mean[:n], c.vari[:n], c.hi[:n]
	om, ov, oh := o.mean[:n], o.vari[:n], o.hi[:n]
	for k := range mean {
		mean[k] += sign * om[k]
		vari[k] += sign * ov[k]
		hi[k] += sign * oh[k]
	}
	c.extend(n)
	c.flat.add(o.flat, sign)
}

// copyFrom makes c equal to o.
func (c *curve) copyFrom(o curve) {
	c.zero()
	copy(c.mean, o.mean[:o.n])
	copy(c.vari, o.vari[:o.n])
	copy(c.hi, o.hi[:o.n])
	c.n = o.n
	c.flat = o.flat
}

// peakWith is the peak over the future of c + o (o may be the zero curve):
// at each point the smaller of mean + z·sd and the all-alive bound. Past
// both extents every point is the flat parts alone.
func (c curve) peakWith(o curve, z float64) float64 {
	bound := func(k int) float64 {
		p := c.at(k)
		p.add(o.at(k), 1)
		if p.vari > 0 {
			p.mean += z * math.Sqrt(p.vari)
		}
		return min(p.mean, p.hi)
	}
	peak := math.Inf(-1)
	n := max(c.n, o.n)
	if n < predict.GridLen {
		peak = bound(n) // every point from n on: the flat parts alone
	}
	for k := range n {
		peak = max(peak, bound(k))
	}
	return peak
}

// rebuildEvery is how many incremental updates a GPU's forecast takes
// before it is summed again from its tickets, so that rounding cannot
// accumulate.
const rebuildEvery = 1 << 12

// maxTenantLengths bounds the per-tenant predictors of a queue.
const maxTenantLengths = 256

// forecastAddLocked computes t's curve and adds it to p's forecast
// (Predicted only).
func (s *Scheduler) forecastAddLocked(p *gpu, t *Ticket) {
	if !s.set.policy.predicted {
		return
	}
	if p.fc.mean == nil {
		p.fc = newCurve()
	}
	if t.fc.mean == nil {
		t.fc = s.newCurveLocked()
	} else {
		t.fc.zero()
	}
	if s.freshLocked(t) && !t.sharesLocked() {
		// Just admitted: its curve is the one its admission computed.
		t.fc.copyFrom(s.fw.scratch)
	} else {
		for i := range t.groups {
			g := &t.groups[i]
			s.groupCurveLocked(&t.fc, g.Group, g.held, g.live, g.gen, t.opaque, t.lens)
		}
	}
	if len(t.groups) == 0 {
		t.fc.addConst(float64(t.weight), 0, float64(t.weight))
	}
	p.fc.add(t.fc, 1)
	t.fc.set = true
	s.forecastChangedLocked(p)
}

// freshLocked says whether t has not run yet and the scratch curve is its
// request's.
func (s *Scheduler) freshLocked(t *Ticket) bool {
	if s.fw.scratchSeq != t.seq || t.seq == 0 || s.fw.scratchLens != t.lens || s.fw.scratchOpaque != t.opaque || len(t.groups) == 0 {
		return false
	}
	for i := range t.groups {
		if g := &t.groups[i]; g.gen != 0 || g.live != g.Seqs {
			return false
		}
	}
	return true
}

// forecastSubLocked takes t's curve out of p's forecast and recycles it.
func (s *Scheduler) forecastSubLocked(p *gpu, t *Ticket) {
	if !t.fc.set {
		return
	}
	p.fc.add(t.fc, -1)
	t.fc.set = false
	s.forecastChangedLocked(p)
}

func (s *Scheduler) forecastChangedLocked(p *gpu) {
	p.boundOK = false
	if p.fcOps++; p.fcOps >= rebuildEvery {
		p.fc.n = predict.GridLen // what left may have left residues anywhere
		p.fc.zero()
		for t := p.first; t != nil; t = t.next {
			if t.fc.set {
				p.fc.add(t.fc, 1)
			}
		}
		if p.tableBytes != 0 {
			p.fc.addConst(float64(p.tableBytes), 0, float64(p.tableBytes))
		}
		p.fcOps = 0
	}
}

// newCurveLocked takes a curve from the free list, or makes one.
func (s *Scheduler) newCurveLocked() curve {
	if n := len(s.fw.freeCurves); n > 0 {
		c := s.fw.freeCurves[n-1]
		s.fw.freeCurves = s.fw.freeCurves[:n-1]
		c.zero()
		return c
	}
	return newCurve()
}

// recycleCurveLocked gives t's curve arrays back for another ticket.
func (s *Scheduler) recycleCurveLocked(t *Ticket) {
	if t.fc.mean != nil && len(s.fw.freeCurves) < 1024 {
		s.fw.freeCurves = append(s.fw.freeCurves, curve{mean: t.fc.mean, vari: t.fc.vari, hi: t.fc.hi, n: t.fc.n})
	}
	t.fc = curve{}
}

func (c *curve) addConst(mean, vari, hi float64) { c.flat.add(point{mean, vari, hi}, 1) }

// groupCurveLocked adds one group's curve to c: held at its worst case
// throughout when there is no predictor (warm-up, or a request that is not
// predicted); the predictor's curve when its progress is reported; and,
// when it is not (opaque), its final size's distribution at every step —
// its size never exceeds its final one, and without progress nothing tells
// how far along it is.
func (s *Scheduler) groupCurveLocked(c *curve, g Group, held int64, live, gen int, opaque bool, lens *predict.Lengths) {
	if live <= 0 {
		return
	}
	worst := float64(satMul(kvbudget.GroupBlocks(g.Prompt, g.Cap, live, g.BlockTokens, held), g.BlockBytes))
	switch {
	case lens == nil:
		c.addConst(worst, 0, worst)
	case opaque:
		m, v := finalSizeMoments(g, held, live, lens)
		c.addConst(m, v, worst)
	default:
		c.extend(predict.Item{Prompt: g.Prompt, Generated: gen, Cap: g.Cap, Seqs: live, BlockTokens: g.BlockTokens,
			BlockBytes: g.BlockBytes, Lead: forecastLead(g), Lengths: lens, HeldShared: held}.AddWithAllAlive(c.mean, c.vari, c.hi))
	}
}

// forecastLead is how many tokens a sequence may be ahead of the
// generated count its forecast was computed with: Progress recomputes a
// ticket's curve only when a sequence enters a new block, so a curve is up
// to a block stale (a sequence crosses its next boundary that much sooner
// than the curve says), plus what the backend has computed and the gateway
// not yet seen (leadTokens). Without it a forecast whose lengths are known
// exactly — outputs pinned to max_tokens, all samples cut by their cap —
// has no margin at all, and the staleness alone overflowed a GPU.
func forecastLead(g Group) int { return g.BlockTokens + leadTokens - 1 }

// finalSizeMoments are the mean and variance of a group's final size when
// each live sequence's length is min(L, Cap), L drawn from lens: the shared
// prompt blocks, and each sequence's own blocks independently.
func finalSizeMoments(g Group, held int64, live int, lens *predict.Lengths) (mean, variance float64) {
	shared := int64(g.Prompt / g.BlockTokens)
	first := blocks(g.Prompt+1, g.BlockTokens)
	last := blocks(satAdd(g.Prompt, g.Cap), g.BlockTokens)
	var e1, e2 float64
	for j := first; j <= last; j++ {
		// Lengths x in [lo+1, hi] end in block j: P = S(lo) − S(hi); the
		// last block takes everything from lo on (the cap stops it there).
		lo := int(j-1)*g.BlockTokens - g.Prompt
		p := lens.Survival(lo)
		if j < last {
			p -= lens.Survival(int(j)*g.BlockTokens - g.Prompt)
		}
		own := float64(j - shared)
		e1 += p * own
		e2 += p * own * own
	}
	bb := float64(g.BlockBytes)
	n := float64(live)
	return (float64(max(shared-held, 0)) + n*e1) * bb, n * max(e2-e1*e1, 0) * bb * bb
}

// waiterCurveLocked is w's curve as it would start now, in the scheduler's
// scratch curve. It is computed once per request and predictor state: an
// admission reads it for the charge, to choose the GPU, and as the new
// ticket's own curve.
func (s *Scheduler) waiterCurveLocked(w *waiter) curve {
	c := &s.fw.scratch
	if s.fw.scratchSeq == w.seq && s.fw.scratchLens == w.lens && s.fw.scratchOpaque == w.opaque && w.seq != 0 {
		return *c
	}
	s.fw.scratchSeq, s.fw.scratchLens, s.fw.scratchOpaque = w.seq, w.lens, w.opaque
	c.zero()
	for _, g := range w.shape {
		s.groupCurveLocked(c, g, 0, g.Seqs, 0, w.opaque, w.lens)
	}
	if len(w.shape) == 0 {
		c.addConst(float64(w.weight), 0, float64(w.weight))
	}
	return *c
}

// chargeLocked is what w will count for against tenant caps, reservations
// and the drain rate: its worst case, or under Predicted the peak of its
// expected size.
func (s *Scheduler) chargeLocked(w *waiter) int64 {
	if !s.set.policy.predicted || w.lens == nil {
		return w.weight
	}
	return curveCharge(s.waiterCurveLocked(w), w.weight)
}

// ticketChargeLocked is t's charge with its current forecast (computed
// first) and worst case weight.
func (s *Scheduler) ticketChargeLocked(t *Ticket, weight int64) int64 {
	if !t.fc.set || t.lens == nil {
		return weight
	}
	return curveCharge(t.fc, weight)
}

func curveCharge(c curve, weight int64) int64 {
	m := 0.0
	for _, v := range c.mean[:c.n] {
		m = max(m, v)
	}
	// A request's own points are never negative: its peak is the largest
	// of them over its flat part (the flat part alone past its extent).
	m += c.flat.mean
	return min(max(int64(math.Ceil(m)), 1), weight)
}

// boundLocked is the peak of p's forecast, or its worst case if that is
// less.
func (s *Scheduler) boundLocked(p *gpu) float64 {
	if !p.boundOK {
		p.bound = 0
		if p.fc.mean != nil {
			p.bound = min(max(p.fc.peakWith(curve{}, s.set.policy.z*p.marginOrOne()), 0), float64(p.held))
		}
		p.boundOK = true
	}
	return p.bound
}

// fitsLocked says whether w (whose curve is c under Predicted) fits p now,
// and, when needRoom, the room p would have left.
func (s *Scheduler) fitsLocked(p *gpu, w *waiter, c curve, needRoom bool) (room float64, adds int64, fits bool) {
	adds = w.weight
	var extra float64 // what p's table would gain: held throughout
	if p.sharing && w.shared > 0 {
		shared, fresh, runs := s.shareOnLocked(p, w)
		adds = w.weight - shared + fresh
		extra = float64(fresh)
		if s.set.policy.predicted {
			c = s.ownCurveLocked(w, runs)
		}
	}
	worst := satAdd64(p.held, adds)
	if !s.set.policy.predicted {
		room = float64(p.admitCap()) - float64(worst)
		return room, adds, room >= 0
	}
	// Every worst case fitting beside the others' is safe whatever the
	// forecast or the backend's report says: no forecast to compute (an
	// eighth of the gateway's CPU against an instant backend with a budget
	// that never fills), and no headroom gate to wait for, which would hold a
	// request that the worst-case policy admits. Not so for a GPU whose
	// part of the GPU is a lease: the gate is what stops it when another
	// replica's batch outgrows its forecast.
	if !needRoom && !p.limited && worst <= p.admitCap() {
		return 0, adds, true
	}
	if s.gatedLocked(p) || !s.exposureFitsLocked(p, w) {
		return 0, adds, false
	}
	base := p.fc
	if base.mean == nil {
		base = newCurve()
		p.fc = base
	}
	// The worst case is never less safe than the forecast: with few
	// requests the normal bound can exceed it.
	// A constant moves every point of the bound alike: the table's growth
	// adds to the peak as it is.
	peak := min(base.peakWith(c, s.zForLocked(w)*p.marginOrOne())+extra, float64(worst))
	room = float64(p.admitCap()) - peak
	return room, adds, room >= 0
}

// zForLocked is the bound w is admitted on: the policy's looser one when
// the guard can stop and resume it, since what that bound risks is then a
// pause for w or another such stream (the guard's first victims), never an
// error.
func (s *Scheduler) zForLocked(w *waiter) float64 {
	if w.resumable() {
		return s.set.policy.zResumable
	}
	return s.set.policy.z
}

// lengthsForLocked is the predictor a new request of tenant t and class
// class in q is forecast with: the tenant's own once it has enough
// samples, else the class's own once it has (and the queue has seen
// another class), else the queue's once it has,
// else none (held at its worst case). A request of a queue, tenant or class
// whose forecast is distrusted gets none.
func (s *Scheduler) lengthsForLocked(q *queue, t *tenantState, class string) *predict.Lengths {
	if !s.set.policy.predicted || !s.trustedLocked(q) ||
		!s.scopeTrustedLocked(q, scopeKey{scopeTenant, t.name}) || !s.scopeTrustedLocked(q, scopeKey{scopeClass, class}) {
		return nil
	}
	warmup := s.set.policy.warmup
	if !q.warm {
		if q.lengths.Samples() < warmup {
			return nil
		}
		s.warmLocked(q)
	}
	if l := q.byTenant[t.name]; l != nil && l.Samples() >= warmup {
		s.warmScopeLocked(q, scopeKey{scopeTenant, t.name}, l)
		return l
	}
	// A queue of one class has the class's lengths as its own.
	if l := q.byClass[class]; l != nil && len(q.byClass) > 1 && l.Samples() >= warmup {
		s.warmScopeLocked(q, scopeKey{scopeClass, class}, l)
		return l
	}
	if q.lengths.Samples() >= warmup {
		return q.lengths
	}
	return nil
}

// warmLocked ends q's warm-up: every sequence of q still running teaches
// its predictors a censored sample at the length it has reached. The first
// warmup_samples to finish are the shortest of those admitted (the long
// ones are still running), and lengths learned from them alone are short
// exactly where the memory is; with the survivors counted as at least as
// long as they are, Kaplan–Meier is unbiased up to where they have got, and
// past that it knows nothing and holds a request to its cap. A survivor is
// counted again when it finishes, which errs towards longer outputs, as
// the predictor does wherever it must err.
func (s *Scheduler) warmLocked(q *queue) {
	q.warm = true
	s.censorRunningLocked(q, func(t *Ticket) bool { return true }, func(t *Ticket, n int) {
		s.observeLocked(q, t.tenant.name, t.line.name, n, true)
	})
	// A tenant's or class's own lengths that are used from now on had
	// their survivors counted here: counting them again would double them.
	if q.warmScopes == nil {
		q.warmScopes = map[scopeKey]bool{}
	}
	for name, l := range q.byTenant {
		if l.Samples() >= s.set.policy.warmup {
			q.warmScopes[scopeKey{scopeTenant, name}] = true
		}
	}
	for name, l := range q.byClass {
		if l.Samples() >= s.set.policy.warmup {
			q.warmScopes[scopeKey{scopeClass, name}] = true
		}
	}
}

// warmScopeLocked is warmLocked for a tenant's or a class's own lengths l,
// the first time they are used since they started: a tenant that joins
// after the queue warmed up learns its first samples from its shortest
// answers too. Only l learns from it (the queue's lengths had theirs).
func (s *Scheduler) warmScopeLocked(q *queue, k scopeKey, l *predict.Lengths) {
	if q.warmScopes[k] {
		return
	}
	if q.warmScopes == nil {
		q.warmScopes = map[scopeKey]bool{}
	}
	q.warmScopes[k] = true
	s.fw.scratchSeq, s.fw.ownSeq = 0, 0
	s.censorRunningLocked(q, func(t *Ticket) bool {
		if k.kind == scopeTenant {
			return t.tenant.name == k.name
		}
		return t.line.name == k.name
	}, func(_ *Ticket, n int) { l.Observe(n, true) })
}

// censorRunningLocked calls observe with the length each live sequence of
// q's tickets that match has reached (pinned and opaque ones teach
// nothing).
func (s *Scheduler) censorRunningLocked(q *queue, match func(*Ticket) bool, observe func(*Ticket, int)) {
	for _, r := range q.routes {
		for t := r.p.first; t != nil; t = t.next {
			if t.line.q != q || t.pinned || t.opaque || t.weight == 0 || !match(t) {
				continue
			}
			for i := range t.groups {
				g := &t.groups[i]
				for range g.live {
					observe(t, g.gen)
				}
			}
		}
	}
}

// observeLocked teaches q's predictors one finished sequence of tenant and
// class.
func (s *Scheduler) observeLocked(q *queue, tenant, class string, n int, capped bool) {
	s.fw.scratchSeq, s.fw.ownSeq = 0, 0 // the predictor moves: no curve computed before stands
	q.lengths.Observe(n, capped)
	q.tallyLocked(tenant, class, n, capped)
	if class != "" {
		observeIn(q.byClass, class, q.spec.maxLen, n, capped)
	}
	if tenant != "" { // the anonymous tenant is the queue at large
		observeIn(q.byTenant, tenant, q.spec.maxLen, n, capped)
	}
}

// observeIn teaches the lengths of key in m, made for it if m has room.
func observeIn(m map[string]*predict.Lengths, key string, maxLen, n int, capped bool) {
	l := m[key]
	if l == nil && len(m) < maxTenantLengths {
		l, _ = predict.NewLengths(predict.LengthsConfig{MaxLen: maxLen})
		m[key] = l
	}
	if l != nil {
		l.Observe(n, capped)
	}
}

// remainingLocked is how many steps w would run if it started now: under
// Predicted, at the 0.9 quantile of its length when it is predicted
// (pessimistic: a backfilled request must not outlast the reservation it
// passes); otherwise its cap.
func (s *Scheduler) remainingLocked(w *waiter) int {
	r := 0
	for _, g := range w.shape {
		r = max(r, groupRemaining(g, 0, w.opaque, w.lens, 0.9))
	}
	if len(w.shape) == 0 {
		return math.MaxInt32 // no shape, no length: it may run as long as anything
	}
	return r
}

// ticketRemainingLocked is how many more steps t is expected to run: the
// median of its conditional length, or its cap without a predictor.
func (s *Scheduler) ticketRemainingLocked(t *Ticket) int {
	r := 0
	for i := range t.groups {
		g := &t.groups[i]
		if g.live > 0 {
			r = max(r, groupRemaining(g.Group, g.gen, t.opaque, t.lens, 0.5))
		}
	}
	if len(t.groups) == 0 {
		return math.MaxInt32
	}
	return r
}

func groupRemaining(g Group, gen int, opaque bool, lens *predict.Lengths, q float64) int {
	if lens == nil || opaque {
		return max(g.Cap-gen, 0)
	}
	return predict.Item{Prompt: g.Prompt, Generated: gen, Cap: g.Cap, Seqs: 1, BlockTokens: g.BlockTokens,
		BlockBytes: g.BlockBytes, Lengths: lens}.Remaining(q)
}
