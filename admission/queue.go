package admission

import "time"

// classState is one priority class: its spec and its FIFO of waiters.
// budget and name never change; every other field (spec included, which
// Reconfigure replaces) is guarded by Budget.mu. A class keeps its identity
// across Reconfigure while its name stays, so tickets and waiters can point
// at it.
type classState struct {
	budget      *Budget // fixed
	name        string  // fixed: a class's identity across reloads; read without the lock
	spec        classSpec
	index       int // position in Budget.classes; -1 once removed
	head, tail  *waiter
	queued      int
	queuedBytes int64
	held        int64
}

// maxBytes is the class's queued-weight bound; < 0 means unbounded.
func (c *classState) maxBytes(nominal int64) int64 {
	switch {
	case c.spec.maxQueuedBytes > 0:
		return c.spec.maxQueuedBytes
	case c.spec.maxQueuedBytes < 0:
		return -1
	}
	if nominal > (1<<62)/DefaultQueuedBytesFactor {
		return -1
	}
	return DefaultQueuedBytesFactor * nominal
}

type waiterState uint8

const (
	waiting  waiterState = iota
	granted              // weight added to held; ticket filled in
	refused              // err set
	canceled             // removed by its own goroutine
)

// waiter is a queued Acquire. Fields are guarded by Budget.mu until ready is
// closed; from then on they are final (except that a canceled grant is given
// back under the lock) and the waiting goroutine reads them freely.
type waiter struct {
	t          *Ticket // handed out on grant (&own, or the caller's); class and tenant live here
	own        Ticket
	weight     int64
	enqueued   time.Time
	ready      chan struct{} // closed once state leaves waiting because of someone else
	timer      Timer         // deadline; nil if none
	prev, next *waiter
	state      waiterState
	err        *RejectError // when refused
}

func (c *classState) pushLocked(w *waiter) {
	w.prev, w.next = c.tail, nil
	if c.tail == nil {
		c.head = w
	} else {
		c.tail.next = w
	}
	c.tail = w
}

func (c *classState) unlinkLocked(w *waiter) {
	if w.prev == nil {
		c.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		c.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next = nil, nil
}

// enqueueLocked appends w to its class and counts it everywhere.
func (b *Budget) enqueueLocked(w *waiter) {
	c, t := w.t.class, w.t.tenant
	c.pushLocked(w)
	c.queued++
	c.queuedBytes += w.weight
	t.queued[c.index]++
	t.queuedBytes[c.index] += w.weight
	t.queuedTotal++
	t.queuedBytesTotal += w.weight
	b.queued++
	b.queuedBytes += w.weight
}

// dequeueLocked takes w out of its class and out of every count, and stops
// its deadline timer. It does not run dispatch.
func (b *Budget) dequeueLocked(w *waiter) {
	c, t := w.t.class, w.t.tenant
	c.unlinkLocked(w)
	c.queued--
	c.queuedBytes -= w.weight
	if c.index >= 0 {
		t.queued[c.index]--
		t.queuedBytes[c.index] -= w.weight
	}
	t.queuedTotal--
	t.queuedBytesTotal -= w.weight
	b.queued--
	b.queuedBytes -= w.weight
	if w.timer != nil {
		w.timer.Stop()
	}
}

// refuseLocked removes a waiting w with a refusal and wakes its goroutine,
// which reports it. RetryAfter must already be computed by the caller.
func (b *Budget) refuseLocked(w *waiter, now time.Time, reason error, limit int64, retry time.Duration) {
	b.dequeueLocked(w)
	w.state = refused
	w.err = &RejectError{Reason: reason, RetryAfter: retry, Weight: w.weight, Capacity: limit,
		Waited: now.Sub(w.enqueued), Class: w.t.class.name, Tenant: w.t.tenant.name}
	close(w.ready)
}

// grantLocked admits w: the weight moves from the queue to held.
func (b *Budget) grantLocked(w *waiter, now time.Time) {
	b.dequeueLocked(w)
	b.holdLocked(w.t.class, w.t.tenant, w.weight)
	w.t.weight = w.weight
	w.t.waited = now.Sub(w.enqueued)
	w.state = granted
	close(w.ready)
	b.checkLocked(opGrant)
}

// holdLocked adds weight to held, for the budget, the class and the tenant.
func (b *Budget) holdLocked(c *classState, t *tenantState, weight int64) {
	b.held += weight
	c.held += weight
	t.held += weight
}

// unholdLocked is the reverse of holdLocked.
func (b *Budget) unholdLocked(c *classState, t *tenantState, weight int64) {
	b.held -= weight
	c.held -= weight
	t.held -= weight
}

// dispatchLocked admits every waiter that may go now, in policy order (see
// doc.go): classes by priority, FIFO within a class; a waiter over its
// tenant's cap is skipped, and so are its tenant's later waiters in this
// pass; the first other waiter that does not fit stops the pass and is left
// in b.blocker for Acquire's fast check.
//
// It costs O(waiters skipped) per pass: skipped waiters are those of tenants
// at their cap, bounded by the queue bounds.
func (b *Budget) dispatchLocked() {
	b.blocker = b.dispatchPassLocked()
	b.checkLocked(opDispatch)
}

func (b *Budget) dispatchPassLocked() (blocker *waiter) {
	if b.queued == 0 {
		return nil
	}
	b.pass++
	var now time.Time
	for _, c := range b.classes {
		for w := c.head; w != nil; {
			next := w.next
			t := w.t.tenant
			if t.pass == b.pass || t.held+w.weight > t.cap {
				t.pass = b.pass
				w = next
				continue
			}
			if b.held+w.weight > b.effective {
				return w
			}
			if now.IsZero() {
				now = b.clock.Now()
			}
			b.grantLocked(w, now)
			w = next
		}
	}
	return nil
}

// refuseImpossibleLocked refuses the waiters that can never be admitted
// under the current capacity and tenant caps (after Resize or Reconfigure
// lowered them), so that none of them blocks the queue until its deadline.
func (b *Budget) refuseImpossibleLocked(now time.Time) {
	for _, c := range b.classes {
		for w := c.head; w != nil; {
			next := w.next
			switch {
			case w.weight > b.nominal:
				b.refuseLocked(w, now, ErrTooLarge, b.nominal, 0)
			case w.weight > w.t.tenant.cap:
				b.refuseLocked(w, now, ErrTenantQuota, w.t.tenant.cap, 0)
			}
			w = next
		}
	}
}
