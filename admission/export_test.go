package admission

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/kvgate/kvgate/admission/predict"
)

// SetCheck makes s call f with its lock held after every change of state,
// with the operation's name and the first broken invariant (nil if none).
// f must not call into s.
func SetCheck(s *Scheduler, f func(op string, err error)) {
	s.mu.Lock()
	s.knobs.check = func(op string) { f(op, s.invariantsLocked(op)) }
	s.mu.Unlock()
}

// invariantsLocked checks everything that must hold after op: the capacity
// bound at admissions, the bookkeeping sums of GPUs, tickets, tenants,
// lines and forecasts, the lines' links — and, where the state is settled
// (after a dispatch pass or an immediate admission), that no waiter could
// be admitted.
func (s *Scheduler) invariantsLocked(op string) error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(op+": "+format, a...)) }

	tenantCharge := map[*gpu]int64{}
	for name, t := range s.tenants {
		if t.name != name {
			bad("tenant map key %q holds %q", name, t.name)
		}
		for _, h := range t.holds {
			if h.charge < 0 {
				bad("tenant %q holds %d < 0 on %q", name, h.charge, h.p.name)
			}
			tenantCharge[h.p] += h.charge
		}
	}
	if len(s.tenants) > s.sweepAt {
		bad("%d tenants tracked, the sweep bound is %d", len(s.tenants), s.sweepAt)
	}

	for i, p := range s.gpus {
		if p.index != i {
			bad("GPU %q index %d at %d", p.name, p.index, i)
		}
		if p.effective < 1 || p.effective > p.nominal {
			bad("GPU %q effective %d outside [1, nominal %d]", p.name, p.effective, p.nominal)
		}
		var held, charge, now, stopping, preempting int64
		n := 0
		var want curve
		if s.set.policy.predicted {
			want = newCurve()
		}
		for t := p.first; t != nil; t = t.next {
			n++
			if t.gpu != p || t.weight <= 0 || t.charge <= 0 || t.charge > t.weight {
				bad("ticket %v on %q: GPU %q weight %d charge %d", t, p.name, t.gpu.name, t.weight, t.charge)
			}
			held += t.weight
			charge += t.charge
			now += t.guard.now
			if t.guard.stopped {
				stopping += t.guard.now
			}
			if t.preempting < 0 {
				bad("ticket %v preempting %d < 0", t, t.preempting)
			}
			preempting += t.preempting
			if t.guard.now > t.weight || t.guard.now < 0 {
				bad("ticket %v now %d outside [0, its worst case %d]", t, t.guard.now, t.weight)
			}
			if s.set.policy.predicted {
				if !t.fc.set {
					bad("ticket %v has no forecast under Predicted", t)
				} else {
					if k := pastExtent(t.fc); k >= 0 {
						bad("ticket %v forecast has point %d non-zero past its extent %d", t, k, t.fc.n)
					}
					want.add(t.fc, 1)
				}
			}
		}
		// The table: each block's count is the tickets that hold it, and
		// its bytes are counted once, in held and in the charge.
		refs, table, refBytes := map[uint64]int32{}, int64(0), int64(0)
		for t := p.first; t != nil; t = t.next {
			for _, g := range t.groups {
				for _, h := range g.Prefix[:g.held] {
					if refs[h] == 0 {
						table += g.BlockBytes
					}
					refs[h]++
				}
				refBytes += g.held * g.BlockBytes
			}
		}
		if len(refs) != p.table.n || table != p.tableBytes || refBytes != p.sharedRefs {
			bad("GPU %q table has %d blocks, %d bytes, %d referenced; its tickets hold %d, %d, %d",
				p.name, p.table.n, p.tableBytes, p.sharedRefs, len(refs), table, refBytes)
		}
		for h, n := range refs {
			if p.table.get(h) != n {
				bad("GPU %q table counts %d holders of a block its tickets hold %d times", p.name, p.table.get(h), n)
				break
			}
		}
		listed := 0
		p.table.each(func(uint64, int32) { listed++ })
		if listed != p.table.n {
			bad("GPU %q table lists %d names, counts %d", p.name, listed, p.table.n)
		}
		held, charge, now = held+table, charge+table, now+table
		if s.set.policy.predicted && table != 0 {
			want.addConst(float64(table), 0, float64(table))
		}
		if n != p.tickets || held != p.held || charge != p.charge {
			bad("GPU %q counts %d tickets, %d held, %d charge; its list has %d, %d, %d",
				p.name, p.tickets, p.held, p.charge, n, held, charge)
		}
		if now != p.now || stopping != p.stopping || preempting != p.preempting {
			bad("GPU %q counts now %d, stopping %d, preempting %d; its tickets %d, %d, %d", p.name, p.now, p.stopping, p.preempting, now, stopping, preempting)
		}
		if (op == opProgress || op == opResize) && s.set.policy.predicted && p.now-p.stopping > p.guardLine() {
			for t := p.first; t != nil; t = t.next {
				if t.guard.stopper != nil && !t.guard.stopped && !t.guard.lingering && t.guard.now > 0 {
					bad("GPU %q: what is not stopped may hold %d > its line %d, and ticket %v could have been stopped", p.name, p.now-p.stopping, p.guardLine(), t)
					break
				}
			}
		}
		if tenantCharge[p]+p.tableBytes != p.charge {
			bad("tenants hold %d on %q, its tickets %d", tenantCharge[p], p.name, p.charge)
		}
		if s.set.policy.predicted && p.fc.mean != nil {
			if k := pastExtent(p.fc); k >= 0 {
				bad("GPU %q forecast has point %d non-zero past its extent %d", p.name, k, p.fc.n)
			}
			for k := range want.mean {
				w, got := want.at(k), p.fc.at(k)
				if d := math.Abs(w.mean - got.mean); d > 1e-6*max(1, math.Abs(w.mean)) {
					bad("GPU %q forecast mean[%d] %v, its tickets sum to %v", p.name, k, got.mean, w.mean)
					break
				}
			}
		}
		// Every admission keeps at least the looser bound, a resumable
		// stream's (committedLocked is the stricter one).
		// A preemptive one keeps what is held now within it instead, and
		// what the guard could stop for it (preemption.go).
		switch {
		case op == opGrant && p == s.last.hold && s.last.preemptive:
			if p.now-p.stopping > p.admitCap() || p.limited {
				bad("GPU %q (limited %v) holds %d now > effective %d at a preemptive grant", p.name, p.limited, p.now-p.stopping, p.admitCap())
			}
		case (op == opAdmit || op == opGrant) && p == s.last.hold && s.loosestCommittedLocked(p) > p.admitCap():
			bad("GPU %q committed %d > effective %d (limit %d) at an admission", p.name, s.loosestCommittedLocked(p), p.effective, p.limitOrNone())
		}
	}

	queued := 0
	for _, q := range s.queues {
		for ci, l := range q.lines {
			if l.index != ci || l.q != q {
				bad("queue %q line %q index %d at %d", q.name, l.name, l.index, ci)
			}
			var cn int
			var cb int64
			perTenant := map[*tenantState]tenantQueued{}
			var prev *waiter
			for w := l.head; w != nil; w = w.next {
				cn++
				cb += w.weight
				tq := perTenant[w.tenant]
				tq.n++
				tq.bytes += w.weight
				perTenant[w.tenant] = tq
				switch {
				case w.prev != prev:
					bad("broken prev link in %q/%q", q.name, l.name)
				case prev != nil && prev.seq > w.seq:
					bad("line %q/%q out of arrival order", q.name, l.name)
				case w.state != waiting:
					bad("queued waiter in state %d", w.state)
				case w.line != l:
					bad("waiter of %q/%q queued in %q/%q", w.line.q.name, w.line.name, q.name, l.name)
				case s.tenants[w.tenant.name] != w.tenant:
					bad("waiter's tenant %q is not in the map", w.tenant.name)
				}
				if reason, _ := s.refusalLocked(w); reason != nil && reason != ErrOverloaded {
					bad("waiter of weight %d in %q can never be admitted (%v)", w.weight, q.name, reason)
				}
				prev = w
			}
			if l.tail != prev {
				bad("line %q/%q tail is not its last waiter", q.name, l.name)
			}
			if cn != l.queued || cb != l.queuedBytes {
				bad("line %q/%q counts %d/%d, list has %d/%d", q.name, l.name, l.queued, l.queuedBytes, cn, cb)
			}
			for t, tq := range l.tenants {
				if perTenant[t] != *tq {
					bad("line %q/%q tenant %q counts %+v, list has %+v", q.name, l.name, t.name, *tq, perTenant[t])
				}
				delete(perTenant, t)
			}
			if len(perTenant) > 0 {
				bad("line %q/%q has uncounted tenants", q.name, l.name)
			}
			queued += cn
		}
	}
	if queued != s.queued {
		bad("scheduler counts %d queued, lines have %d", s.queued, queued)
	}
	var tq int
	for _, t := range s.tenants {
		tq += t.queued
	}
	if tq != s.queued {
		bad("tenants count %d queued, the scheduler %d", tq, s.queued)
	}

	if op == opDispatch || op == opAdmit {
		saved := make([]reservation, len(s.gpus))
		for i, p := range s.gpus {
			saved[i] = p.res
		}
		if w, _ := s.passLocked(true); w != nil {
			bad("waiter of weight %d (queue %q, class %q, tenant %q) could be admitted but waits",
				w.weight, w.line.q.name, w.line.name, w.tenant.name)
		}
		for i, p := range s.gpus {
			p.res = saved[i]
		}
	}
	return errors.Join(errs...)
}

// Passes is the dispatch pass counter, for tests of how often dispatch runs.
func Passes(s *Scheduler) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pass
}

// pastExtent is the first point of c at or past its extent that is not
// zero, or -1: every operation on a curve stops at its extent. The check
// runs for every ticket after every operation; it compares the bytes at
// once (a +0 is all zero bits; nothing writes there, so nothing there is
// a −0), and looks for the point only when they are not all zero.
func pastExtent(c curve) int {
	if zeroBits(c.mean[c.n:]) && zeroBits(c.vari[c.n:]) && zeroBits(c.hi[c.n:]) {
		return -1
	}
	for k := c.n; k < len(c.mean); k++ {
		if c.mean[k] != 0 || c.vari[k] != 0 || c.hi[k] != 0 {
			return k
		}
	}
	return -1
}

// zeros is a row of zero bytes as long as a curve's.
var zeros [8 * predict.GridLen]byte

// zeroBits says whether every bit of xs is zero.
func zeroBits(xs []float64) bool {
	if len(xs) == 0 {
		return true
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&xs[0])), 8*len(xs))
	return bytes.Equal(b, zeros[:len(b)])
}

// loosestCommittedLocked is committedLocked at the bound a resumable
// stream is admitted on.
func (s *Scheduler) loosestCommittedLocked(p *gpu) int64 {
	if !s.set.policy.predicted || p.fc.mean == nil {
		return s.committedLocked(p)
	}
	b := min(max(p.fc.peakWith(curve{}, s.set.policy.zResumable*p.marginOrOne()), 0), float64(p.held))
	return int64(b + 0.5)
}
