package admission

import (
	"fmt"
	"math"
)

// tenantState is one tenant's accounting. All fields are guarded by
// Scheduler.mu. A tenant named in the config (and the anonymous tenant "")
// lives as long as the config names it. Any other tenant's state is kept
// while idle, so that a walk-in tenant does not pay for a new state on every
// request, until the map reaches Scheduler.sweepAt; then every idle one is
// dropped at once (amortized O(1)), so arbitrary tenant names cannot grow
// the map without bound.
type tenantState struct {
	name       string
	permanent  bool // listed in the config, or the anonymous tenant
	share      float64
	queueShare float64

	holds       []tenantHold // charge held per GPU; a handful of GPUs at most
	queued      int
	queuedBytes int64

	// skipPass is the dispatch pass in which skipped lists the queues where
	// one of this tenant's waiters was passed over (over its cap everywhere):
	// its later waiters there are passed over in the same pass, so that a
	// tenant's own requests stay in order.
	skipPass uint64
	skipped  []*queue
}

type tenantHold struct {
	p      *gpu
	charge int64
	worst  int64 // Σ worst cases, for the exposure bound (guard.go)
}

// capOn is the most the tenant may hold on p: its share of p's nominal
// capacity.
func (t *tenantState) capOn(p *gpu) int64 {
	if t.share >= 1 {
		return p.nominal
	}
	return int64(t.share * float64(p.nominal))
}

func (t *tenantState) heldOn(p *gpu) int64 {
	for _, h := range t.holds {
		if h.p == p {
			return h.charge
		}
	}
	return 0
}

// fitsOn says whether the tenant may hold charge more on p, what other
// replicas hold for it there included. In a fleet the others' figures are
// a fair-share step old, so replicas that find the same room at once would
// each fill all of it: each takes only its part of the share instead, in
// proportion to the tenant's demand here against its demand on the others
// (as the fair levels split the budget), so that the parts add up to the
// share. A replica holding nothing for the tenant may still take one
// request while the share has room, so that none starves behind the
// others' parts: the tenant passes its share by at most a request a
// replica, and only while its demand moves between them.
func (t *tenantState) fitsOn(p *gpu, charge int64) bool {
	if t.share >= 1 {
		return true
	}
	held, other, limit := t.heldOn(p), p.elsewhere[t.name], t.capOn(p)
	if held+other.Held+charge > limit {
		return false
	}
	if held == 0 || other.Demand <= 0 {
		return true
	}
	// The request asking counts in the demand, whether it queued first or
	// not.
	own := max(t.demandOn(p), held+charge)
	return held+charge <= tenantPart(limit, own, other.Demand)
}

// tenantPart is one replica's part of a tenant's limit: in proportion to
// its demand (own) against the others' (others > 0).
func tenantPart(limit, own, others int64) int64 {
	return int64(float64(limit) * float64(own) / float64(own+others))
}

// demandOn is what the tenant wants on p: what it holds there and what it
// has queued (a queued request may go to any of its queue's GPUs, so it
// counts on each).
func (t *tenantState) demandOn(p *gpu) int64 {
	return t.heldOn(p) + t.queuedBytes
}

// TenantLoad is what a tenant holds on a GPU and what it wants there (its
// holds and its queued requests' weight): what a fleet's replicas tell
// each other so that a tenant's share holds across them.
type TenantLoad struct {
	Held, Demand int64
}

// TenantHolds is each tenant's load on GPU, for tenants whose share caps
// them and that hold or want something there: what a fleet publishes so
// that a tenant's share holds across its replicas.
func (s *Scheduler) TenantHolds(gpu string) map[string]TenantLoad {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.gpuByName[gpu]
	if p == nil {
		return nil
	}
	out := map[string]TenantLoad{}
	for name, t := range s.tenants {
		if t.share >= 1 {
			continue
		}
		if l := (TenantLoad{Held: t.heldOn(p), Demand: t.demandOn(p)}); l.Demand > 0 {
			out[name] = l
		}
	}
	return out
}

// SetTenantsElsewhere says what the other replicas sharing GPU hold and
// want for each tenant there (nil: nothing): their holds count against the
// tenant's share as its own holds do, and their demand sets this replica's
// part of it (fitsOn). Like every shrink it revokes nothing; a change that
// may leave room admits the waiters that now fit.
func (s *Scheduler) SetTenantsElsewhere(gpu string, others map[string]TenantLoad) error {
	s.mu.Lock()
	p := s.gpuByName[gpu]
	if p == nil {
		s.mu.Unlock()
		return fmt.Errorf("admission: tenants elsewhere: unknown GPU %q", gpu)
	}
	// Fewer holds or less demand elsewhere, or a tenant gone from the
	// others' posts, can each make room here.
	room := false
	for name, l := range p.elsewhere {
		n := others[name]
		room = room || n.Held < l.Held || n.Demand < l.Demand
	}
	p.elsewhere = others
	if room {
		s.dispatchLocked()
	}
	s.unlockNotify()
	return nil
}

func (t *tenantState) holdLocked(p *gpu, charge, worst int64) {
	for i := range t.holds {
		if t.holds[i].p == p {
			t.holds[i].charge += charge
			t.holds[i].worst += worst
			return
		}
	}
	t.holds = append(t.holds, tenantHold{p, charge, worst})
}

func (t *tenantState) unholdLocked(p *gpu, charge, worst int64) {
	for i := range t.holds {
		if t.holds[i].p != p {
			continue
		}
		t.holds[i].charge -= charge
		if t.holds[i].worst -= worst; t.holds[i].charge == 0 && t.holds[i].worst == 0 {
			t.holds = append(t.holds[:i], t.holds[i+1:]...)
		}
		return
	}
}

// worstOn is the sum of the worst cases the tenant holds on p.
func (t *tenantState) worstOn(p *gpu) int64 {
	for _, h := range t.holds {
		if h.p == p {
			return h.worst
		}
	}
	return 0
}

func (t *tenantState) held() int64 {
	var n int64
	for _, h := range t.holds {
		n += h.charge
	}
	return n
}

// skippedIn says whether one of the tenant's waiters in q was passed over
// in this pass.
func (t *tenantState) skippedIn(pass uint64, q *queue) bool {
	if t.skipPass != pass {
		return false
	}
	for _, x := range t.skipped {
		if x == q {
			return true
		}
	}
	return false
}

func (t *tenantState) skip(pass uint64, q *queue) {
	if t.skipPass != pass {
		t.skipPass, t.skipped = pass, t.skipped[:0]
	}
	t.skipped = append(t.skipped, q)
}

// queueLimits are the tenant's bounds in a line: its queue share of the
// line's bounds, rounded up so that any share allows one waiter. bytes < 0
// means unbounded.
func (t *tenantState) queueLimits(maxQueued int, maxBytes int64) (count int, bytes int64) {
	if t.queueShare >= 1 {
		return maxQueued, maxBytes
	}
	count = int(math.Ceil(t.queueShare * float64(maxQueued)))
	bytes = maxBytes
	if maxBytes >= 0 {
		bytes = int64(math.Ceil(t.queueShare * float64(maxBytes)))
	}
	return count, bytes
}

// tenantLocked finds or creates the state of the named tenant.
func (s *Scheduler) tenantLocked(name string) *tenantState {
	if name == "" {
		return s.anon
	}
	if t, ok := s.tenants[name]; ok {
		return t
	}
	if len(s.tenants) >= s.sweepAt {
		s.sweepIdleTenantsLocked()
	}
	t := &tenantState{name: name, share: s.set.defaultShare, queueShare: s.set.defaultShare}
	s.tenants[name] = t
	return t
}

// minSweepAt is the fewest idle walk-in tenants kept before a sweep.
const minSweepAt = 1024

// sweepIdleTenantsLocked drops every unlisted tenant that holds and queues
// nothing. No ticket or waiter can still point at one: a ticket keeps a
// hold entry, a waiter keeps queued > 0.
func (s *Scheduler) sweepIdleTenantsLocked() {
	for name, t := range s.tenants {
		if t.idle() {
			delete(s.tenants, name)
		}
	}
	s.sweepAt = max(2*len(s.tenants), len(s.tenants)+minSweepAt)
}

// idle reports whether t is an unlisted tenant with nothing held or queued.
func (t *tenantState) idle() bool {
	return !t.permanent && len(t.holds) == 0 && t.queued == 0
}
