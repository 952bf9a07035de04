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
// replicas hold for it there included.
func (t *tenantState) fitsOn(p *gpu, charge int64) bool {
	return t.share >= 1 || t.heldOn(p)+p.elsewhere[t.name]+charge <= t.capOn(p)
}

// TenantHolds is what each tenant whose share caps it holds on GPU (the
// charge of its tickets there), those holding nothing left out: what a
// fleet publishes so that a tenant's share holds across its replicas.
func (s *Scheduler) TenantHolds(gpu string) map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.gpuByName[gpu]
	if p == nil {
		return nil
	}
	out := map[string]int64{}
	for name, t := range s.tenants {
		if h := t.heldOn(p); h > 0 && t.share < 1 {
			out[name] = h
		}
	}
	return out
}

// SetTenantsElsewhere says what the other replicas sharing GPU's GPU hold
// for each tenant there (nil: nothing): it counts against the tenant's
// share as its own holds do, so that a tenant spread over replicas holds
// its share of the GPU, not its share on each. Like every shrink it
// revokes nothing; a lower figure admits the waiters that now fit.
func (s *Scheduler) SetTenantsElsewhere(gpu string, held map[string]int64) error {
	s.mu.Lock()
	p := s.gpuByName[gpu]
	if p == nil {
		s.mu.Unlock()
		return fmt.Errorf("admission: tenants elsewhere: unknown GPU %q", gpu)
	}
	lower := false
	for name, n := range p.elsewhere {
		lower = lower || held[name] < n
	}
	p.elsewhere = held
	if lower {
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
