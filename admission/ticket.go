package admission

import "time"

// Ticket is admitted weight. Give it back exactly once with Release (further
// calls are no-ops) or in parts with Shrink. A nil or zero Ticket holds
// nothing.
type Ticket struct {
	class  *classState // class.budget is the budget: one pointer fewer to allocate
	tenant *tenantState
	// weight is what the ticket still holds; 0 once released. It only ever
	// decreases while the ticket is out. Guarded by the budget's mu, like the
	// rest of the budget's accounting: Weight takes the lock, so the fast
	// path needs no atomic instruction besides the mutex's own.
	weight int64
	waited time.Duration // set before the ticket is handed out
}

// Release gives the whole weight back. It is idempotent and safe from any
// goroutine: the second call finds nothing held and does nothing.
func (t *Ticket) Release() {
	if t == nil || t.class == nil {
		return
	}
	t.class.budget.shrink(t, 0)
}

// Shrink gives back weight early, keeping to: for when the real usage turns
// out smaller than predicted. to >= the current weight is a no-op; to <= 0
// is Release.
func (t *Ticket) Shrink(to int64) {
	if t == nil || t.class == nil {
		return
	}
	t.class.budget.shrink(t, max(to, 0))
}

// Weight is what the ticket holds now (0 after Release).
func (t *Ticket) Weight() int64 {
	if t == nil || t.class == nil {
		return 0
	}
	b := t.class.budget
	b.mu.Lock()
	w := t.weight
	b.mu.Unlock()
	return w
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
	cur := t.weight
	if to >= cur { // released already, or not a shrink
		b.mu.Unlock()
		return
	}
	give := cur - to
	t.weight = to
	b.unholdLocked(t.class, t.tenant, give)
	b.drain.add(give, b.clock)
	if to == 0 {
		b.checkLocked(opRelease)
	} else {
		b.checkLocked(opShrink)
	}
	if b.queued > 0 {
		b.dispatchLocked()
	}
	b.mu.Unlock()
}

// ticketSlab is how many tickets one allocation makes.
const ticketSlab = 32

// newTicketLocked hands out a zero Ticket carved from a slab, so that the
// fast path allocates once per ticketSlab admissions. Tickets are never
// reused (a late second Release of a recycled ticket would free someone
// else's weight); a slab is freed by the GC once none of its tickets is
// referenced, so a long-lived ticket keeps at most one slab alive.
func (b *Budget) newTicketLocked() *Ticket {
	if len(b.slab) == 0 {
		b.slab = make([]Ticket, ticketSlab)
	}
	t := &b.slab[0]
	b.slab = b.slab[1:]
	return t
}
