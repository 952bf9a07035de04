package admission

import (
	"sort"
	"sync/atomic"
	"time"
)

// Observer is told about every request that leaves Acquire: admitted (at
// once, with waited 0, or after queueing) or refused with a reason label
// (see ReasonOf; "canceled" included). It is how the gateway builds its
// counters and wait histograms. The budget calls it outside its lock, from
// the goroutine that called Acquire, so an implementation may be slow-ish but
// must be safe for concurrent use.
type Observer interface {
	Admitted(class, tenant string, weight int64, waited time.Duration)
	Rejected(class, tenant, reason string, weight int64, waited time.Duration)
}

// Stats is a snapshot of a budget, as plain values.
type Stats struct {
	Capacity    int64 // nominal capacity
	Effective   int64 // after the AIMD loop; <= Capacity
	Held        int64 // may exceed Effective after a shrink, never through an admission
	Queued      int   // waiting requests, all classes
	QueuedBytes int64
	// DrainRate is the measured release rate in weight units per second over
	// the drain window; 0 = no measurement.
	DrainRate float64

	Admitted          int64            // every admission, at once or after waiting
	AdmittedAfterWait int64            // those that queued first
	Rejected          map[string]int64 // by reason label (all of Reasons(), zeros included)
	Canceled          int64            // contexts done before admission

	Classes []ClassStats  // in priority order
	Tenants []TenantStats // sorted by name; listed tenants always, others while active
}

// ClassStats is one class in Stats. Held counts the tickets granted to this
// class under the current configuration (a class removed by Reconfigure
// takes its held weight out of this list, not out of Stats.Held).
type ClassStats struct {
	Name        string
	Queued      int
	QueuedBytes int64
	Held        int64
}

// TenantStats is one tenant in Stats.
type TenantStats struct {
	Name        string
	Cap         int64 // the most it may hold: share × nominal capacity
	Held        int64
	Queued      int
	QueuedBytes int64
}

// counters are the exit-path counts of the slow paths. They are atomics
// rather than fields under Budget.mu because the waiter goroutines count
// their own outcome after the lock is gone. (Immediate admissions are
// counted in Budget.admittedAtOnce, under the lock the fast path holds.)
type counters struct {
	admittedAfterWait, canceled atomic.Int64
	rejected                    [5]atomic.Int64 // indexed by reasonIndex
}

func reasonIndex(reason error) int {
	switch reason {
	case ErrTooLarge:
		return 0
	case ErrQueueFull:
		return 1
	case ErrQueueTimeout:
		return 2
	case ErrOverloaded:
		return 3
	default: // ErrTenantQuota
		return 4
	}
}

// Stats returns a snapshot. It takes the budget's lock once.
func (b *Budget) Stats() Stats {
	b.mu.Lock()
	now := b.clock.Now()
	s := Stats{
		Capacity:    b.nominal,
		Effective:   b.effective,
		Held:        b.held,
		Queued:      b.queued,
		Admitted:    b.admittedAtOnce,
		QueuedBytes: b.queuedBytes,
		DrainRate:   b.drain.rate(now),
		Classes:     make([]ClassStats, len(b.classes)),
		Tenants:     make([]TenantStats, 0, len(b.tenants)),
	}
	for i, c := range b.classes {
		s.Classes[i] = ClassStats{Name: c.name, Queued: c.queued, QueuedBytes: c.queuedBytes, Held: c.held}
	}
	for _, t := range b.tenants {
		if t.idle() {
			continue
		}
		s.Tenants = append(s.Tenants, TenantStats{Name: t.name, Cap: t.cap, Held: t.held,
			Queued: t.queuedTotal, QueuedBytes: t.queuedBytesTotal})
	}
	b.mu.Unlock()
	sort.Slice(s.Tenants, func(i, j int) bool { return s.Tenants[i].Name < s.Tenants[j].Name })
	s.AdmittedAfterWait = b.count.admittedAfterWait.Load()
	s.Admitted += s.AdmittedAfterWait
	s.Canceled = b.count.canceled.Load()
	s.Rejected = make(map[string]int64, 5)
	for _, r := range []error{ErrTooLarge, ErrQueueFull, ErrQueueTimeout, ErrOverloaded, ErrTenantQuota} {
		s.Rejected[reasonLabel(r)] = b.count.rejected[reasonIndex(r)].Load()
	}
	return s
}
