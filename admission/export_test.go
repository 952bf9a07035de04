package admission

import (
	"errors"
	"fmt"
)

// SetCheck makes b call f with its lock held after every change of state,
// with the operation's name and the first broken invariant (nil if none).
// f must not call into b.
func SetCheck(b *Budget, f func(op string, err error)) {
	b.mu.Lock()
	b.knobs.check = func(op string) { f(op, b.invariantsLocked(op)) }
	b.mu.Unlock()
}

// invariantsLocked checks everything that must hold after op: the capacity
// bound at admissions, the bookkeeping sums, the queue's links, and — where
// the state is settled (after a dispatch pass, an immediate admission, an
// enqueue or a shrink of the capacity) — that no waiter could be admitted
// and that b.blocker is where a dispatch pass would stop.
func (b *Budget) invariantsLocked(op string) error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(op+": "+format, a...)) }
	if (op == opAdmit || op == opGrant) && b.held > b.effective {
		bad("held %d > effective %d at an admission", b.held, b.effective)
	}
	if b.held < 0 {
		bad("held %d < 0", b.held)
	}
	if b.effective < 1 || b.effective > b.nominal {
		bad("effective %d outside [1, nominal %d]", b.effective, b.nominal)
	}

	var tenantHeld int64
	for name, t := range b.tenants {
		if t.name != name {
			bad("tenant map key %q holds %q", name, t.name)
		}
		if t.held < 0 {
			bad("tenant %q held %d < 0", name, t.held)
		}
		tenantHeld += t.held
		if len(t.queued) != len(b.classes) || len(t.queuedBytes) != len(b.classes) {
			bad("tenant %q has %d class counters for %d classes", name, len(t.queued), len(b.classes))
		}
	}
	if len(b.tenants) > b.sweepAt {
		bad("%d tenants tracked, the sweep bound is %d", len(b.tenants), b.sweepAt)
	}
	if tenantHeld != b.held {
		bad("tenants hold %d, budget %d", tenantHeld, b.held)
	}

	type tq struct {
		n     []int
		bytes []int64
	}
	perTenant := map[*tenantState]*tq{}
	var n int
	var bytes int64
	for ci, c := range b.classes {
		if c.index != ci {
			bad("class %q index %d at %d", c.name, c.index, ci)
		}
		var cn int
		var cb int64
		var prev *waiter
		for w := c.head; w != nil; w = w.next {
			cn++
			cb += w.weight
			t := w.t.tenant
			switch {
			case w.prev != prev:
				bad("broken prev link in class %q", c.name)
			case w.state != waiting:
				bad("queued waiter in state %d", w.state)
			case w.t.class != c:
				bad("waiter of class %q queued in %q", w.t.class.name, c.name)
			case b.tenants[t.name] != t:
				bad("waiter's tenant %q is not in the map", t.name)
			case w.weight > b.nominal || w.weight > t.cap:
				bad("waiter of weight %d can never fit (nominal %d, tenant cap %d)", w.weight, b.nominal, t.cap)
			}
			if perTenant[t] == nil {
				perTenant[t] = &tq{make([]int, len(b.classes)), make([]int64, len(b.classes))}
			}
			perTenant[t].n[ci]++
			perTenant[t].bytes[ci] += w.weight
			prev = w
		}
		if c.tail != prev {
			bad("class %q tail is not its last waiter", c.name)
		}
		if cn != c.queued || cb != c.queuedBytes {
			bad("class %q counts %d/%d, list has %d/%d", c.name, c.queued, c.queuedBytes, cn, cb)
		}
		n += cn
		bytes += cb
	}
	if n != b.queued || bytes != b.queuedBytes {
		bad("budget counts %d/%d queued, lists have %d/%d", b.queued, b.queuedBytes, n, bytes)
	}
	for name, t := range b.tenants {
		want := perTenant[t]
		var total int
		var totalBytes int64
		for ci := range b.classes {
			var wn int
			var wb int64
			if want != nil {
				wn, wb = want.n[ci], want.bytes[ci]
			}
			if t.queued[ci] != wn || t.queuedBytes[ci] != wb {
				bad("tenant %q class %d counts %d/%d, lists have %d/%d", name, ci, t.queued[ci], t.queuedBytes[ci], wn, wb)
			}
			total += wn
			totalBytes += wb
		}
		if t.queuedTotal != total || t.queuedBytesTotal != totalBytes {
			bad("tenant %q totals %d/%d, lists have %d/%d", name, t.queuedTotal, t.queuedBytesTotal, total, totalBytes)
		}
	}

	switch op {
	case opDispatch, opAdmit, opEnqueue, opFeedback:
		grantable, blocker := b.simulatePassLocked()
		if grantable != nil {
			bad("waiter of weight %d (class %q, tenant %q) could be admitted but waits",
				grantable.weight, grantable.t.class.name, grantable.t.tenant.name)
		}
		if blocker != b.blocker {
			bad("blocker is %p, a dispatch pass would stop at %p", b.blocker, blocker)
		}
	}
	return errors.Join(errs...)
}

// simulatePassLocked is dispatchPassLocked without the grants: the first
// waiter it would admit, or else the one it would stop at.
func (b *Budget) simulatePassLocked() (grantable, blocker *waiter) {
	skipped := map[*tenantState]bool{}
	for _, c := range b.classes {
		for w := c.head; w != nil; w = w.next {
			t := w.t.tenant
			if skipped[t] || t.held+w.weight > t.cap {
				skipped[t] = true
				continue
			}
			if b.held+w.weight > b.effective {
				return nil, w
			}
			return w, nil
		}
	}
	return nil, nil
}
