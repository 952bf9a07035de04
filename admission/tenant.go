package admission

import "math"

// tenantState is one tenant's accounting. All fields are guarded by
// Budget.mu. A tenant named in the config (and the anonymous tenant "")
// lives as long as the config names it. Any other tenant's state is kept
// while idle, so that a walk-in tenant does not pay for a new state on every
// request, until the map reaches Budget.sweepAt; then every idle one is
// dropped at once (amortized O(1)), so arbitrary tenant names cannot grow
// the map without bound.
type tenantState struct {
	name       string
	permanent  bool // listed in the config, or the anonymous tenant
	share      float64
	queueShare float64
	cap        int64 // floor(share × nominal): the most it may hold at once

	held             int64
	queued           []int   // per class index
	queuedBytes      []int64 // per class index
	queuedTotal      int
	queuedBytesTotal int64

	// pass is the dispatch pass in which one of this tenant's waiters was
	// skipped (over its cap); its later waiters are skipped in the same pass so
	// that a tenant's own requests stay FIFO.
	pass uint64
}

func (t *tenantState) setCapLocked(nominal int64) {
	if t.share >= 1 {
		t.cap = nominal
		return
	}
	t.cap = int64(t.share * float64(nominal))
}

// queuedUpToLocked reports whether the tenant has a waiter in class index ci
// or a higher-priority one: a new request of the tenant in class ci must then
// queue behind it.
func (t *tenantState) queuedUpToLocked(ci int) bool {
	if t.queuedTotal == 0 {
		return false
	}
	for i := 0; i <= ci; i++ {
		if t.queued[i] > 0 {
			return true
		}
	}
	return false
}

// queueLimits are the tenant's bounds in class c's queue: its queue share of
// the class's bounds, rounded up so that any share allows one waiter. bytes
// < 0 means unbounded.
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
func (b *Budget) tenantLocked(name string) *tenantState {
	if name == "" {
		return b.anon
	}
	if t, ok := b.tenants[name]; ok {
		return t
	}
	if len(b.tenants) >= b.sweepAt {
		b.sweepIdleTenantsLocked()
	}
	t := &tenantState{name: name, share: b.set.defaultShare, queueShare: b.set.defaultShare,
		queued: make([]int, len(b.classes)), queuedBytes: make([]int64, len(b.classes))}
	t.setCapLocked(b.nominal)
	b.tenants[name] = t
	return t
}

// minSweepAt is the fewest idle walk-in tenants kept before a sweep.
const minSweepAt = 1024

// sweepIdleTenantsLocked drops every unlisted tenant that holds and queues
// nothing. No ticket or waiter can still point at one: a ticket with weight
// keeps held > 0, a waiter keeps queuedTotal > 0.
func (b *Budget) sweepIdleTenantsLocked() {
	for name, t := range b.tenants {
		if t.idle() {
			delete(b.tenants, name)
		}
	}
	b.sweepAt = max(2*len(b.tenants), len(b.tenants)+minSweepAt)
}

// idle reports whether t is an unlisted tenant with nothing held or queued.
func (t *tenantState) idle() bool {
	return !t.permanent && t.held == 0 && t.queuedTotal == 0
}
