package admission

import (
	"sync/atomic"
	"time"
)

// Ticket is admitted weight. Give it back exactly once with Release (further
// calls are no-ops) or in parts with Shrink. A nil *Ticket is valid and
// holds nothing.
type Ticket struct {
	b      *Budget
	class  *classState
	tenant *tenantState
	// weight is what the ticket still holds; 0 once released. It only ever
	// decreases, is written under b.mu, and is read without it by Weight and
	// by Release's early exit.
	weight atomic.Int64
	waited time.Duration
}

// Release gives the whole weight back. It is idempotent and safe from any
// goroutine: the second call finds nothing held and does nothing.
func (t *Ticket) Release() {
	if t == nil || t.weight.Load() == 0 {
		return
	}
	t.b.shrink(t, 0)
}

// Shrink gives back weight early, keeping to: for when the real usage turns
// out smaller than predicted. to >= the current weight is a no-op; to <= 0
// is Release.
func (t *Ticket) Shrink(to int64) {
	if t == nil || to >= t.weight.Load() {
		return
	}
	t.b.shrink(t, max(to, 0))
}

// Weight is what the ticket holds now (0 after Release).
func (t *Ticket) Weight() int64 {
	if t == nil {
		return 0
	}
	return t.weight.Load()
}

// Waited is the time the request spent queued before admission (0 if it was
// admitted at once).
func (t *Ticket) Waited() time.Duration {
	if t == nil {
		return 0
	}
	return t.waited
}

// shrink lowers t's weight to `to` (>= 0) and lets waiters in.
func (b *Budget) shrink(t *Ticket, to int64) {
	b.mu.Lock()
	cur := t.weight.Load()
	if to >= cur { // lost a race with another Release or Shrink
		b.mu.Unlock()
		return
	}
	give := cur - to
	t.weight.Store(to)
	b.unholdLocked(t.class, t.tenant, give)
	b.drain.record(b.clock.Now(), give)
	if to == 0 {
		b.checkLocked(opRelease)
		b.forgetIfIdleLocked(t.tenant)
	} else {
		b.checkLocked(opShrink)
	}
	if b.queued > 0 {
		b.dispatchLocked()
	}
	b.mu.Unlock()
}
