package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/admission/predict"
)

// leadTokens is how far a backend may be ahead of what the gateway has seen
// of a stream: the token being sent and the one being computed. (Forecasts
// add the staleness of the last Progress: see forecastLead.)
const leadTokens = 2

// Ticket is an admission: a request bound to a GPU. Give it back exactly
// once with Release (further calls are no-ops); report its progress with
// Progress and its finished sequences with Done as they happen, so that its
// hold follows what it really uses. A nil or zero Ticket holds nothing.
//
// Its accounting fields are guarded by the scheduler's mu; the names and
// waited are set before the ticket is handed out, and change only while
// Move binds it again (Move's caller reads them once it returns). s is set
// once, at the first admission, and never written again: Release reads it
// without the lock, and may run — the owner giving the request up — while
// a moved ticket is being bound again.
type Ticket struct {
	s *Scheduler
	binding
	// oneGroup holds the groups of a request of one prompt, nearly every
	// request, so that binding it allocates nothing.
	oneGroup [1]tgroup
}

// binding is what a Ticket's admission sets, all of it at each (the first,
// and each Move's).
type binding struct {
	gpu    *gpu
	line   *line
	tenant *tenantState
	// weight is its worst case now (0 once released); charge what it counts
	// for against tenant caps and the drain rate.
	weight, charge int64
	groups         []tgroup // nil for a weight-only request
	opaque         bool
	pinned         bool
	noResume       bool             // Request.NoResume
	lens           *predict.Lengths // its forecast's predictor; nil = worst case
	guard          guardState       // what it holds now, and whether it was stopped (guard.go)
	preempting     int64            // its worst case, when it started on room of lower classes (preemption.go)
	fc             curve            // its share of the GPU's forecast (Predicted only)
	seq            uint64
	affinity       uint64
	predicted      int // output tokens it was expected to generate, all sequences
	waited         time.Duration
	queue, class   string
	gpuName        string
	prev, next     *Ticket // in its GPU's list
}

// tgroup is a Group as it runs.
type tgroup struct {
	Group
	live int   // sequences not finished
	gen  int   // tokens each live sequence has generated, as last accounted
	blk  int64 // blocks a sequence holds at gen (with leadTokens): Progress's lock-free check
	// The change detector's view of it (drift.go): judged says its
	// sequences are judged against the forecast they were admitted on;
	// mark is that forecast's 0.9 quantile (MaxInt when unknown), markBlk
	// the blocks a sequence holds there, over how many blocks past it each
	// has been counted for, and allow the bytes of growth past the mark
	// the forecast expects of a sequence, times driftAllowance.
	judged  bool
	mark    int
	markBlk int64
	over    int64
	allow   float64
	// held is how many of its leading prompt blocks its GPU's table counts
	// for it (share.go): its own size leaves them out.
	held int64
}

func (g *tgroup) blocksAt(generated int) int64 {
	return blocks(satAdd(satAdd(g.Prompt, generated), leadTokens), g.BlockTokens)
}

// GPU is the GPU the ticket is bound to ("" for the zero Ticket).
func (t *Ticket) GPU() string {
	if t == nil {
		return ""
	}
	return t.gpuName
}

// Waited is the time the request spent queued before admission (0 if it was
// admitted at once).
func (t *Ticket) Waited() time.Duration {
	if t == nil {
		return 0
	}
	return t.waited
}

// PredictedOutput is the output tokens the request was expected to
// generate when it was admitted, all sequences together: each sequence's
// cap, or under Predicted the learned median length capped by it. Set at
// admission, it stays after Release, for comparing with what it generated.
func (t *Ticket) PredictedOutput() int {
	if t == nil {
		return 0
	}
	return t.predicted
}

// Weight is the worst case the ticket holds now (0 after Release).
func (t *Ticket) Weight() int64 {
	if t == nil || t.s == nil {
		return 0
	}
	t.s.mu.Lock()
	w := t.weight
	t.s.mu.Unlock()
	return w
}

// Release gives everything back. It is idempotent and safe from any
// goroutine: the second call finds nothing held and does nothing.
func (t *Ticket) Release() {
	if t == nil || t.s == nil {
		return
	}
	s := t.s
	s.mu.Lock()
	if t.weight == 0 {
		s.mu.Unlock()
		return
	}
	s.censorLocked(t)
	s.unholdLocked(t, true)
	s.settleUnlock(opRelease)
}

// settleUnlock checks the invariants after op, lets waiters into what op
// gave back, and releases mu.
func (s *Scheduler) settleUnlock(op string) {
	s.checkLocked(op)
	if s.queued > 0 {
		s.dispatchLocked()
	}
	s.unlockNotify()
}

// Progress reports that each live sequence of group gi has generated
// generated tokens. Only a change of block matters: in between it costs a
// comparison and takes no lock. It must be called from one goroutine at a
// time (the one relaying the request's answer).
func (t *Ticket) Progress(gi, generated int) {
	if t == nil || t.s == nil || gi < 0 || gi >= len(t.groups) {
		return
	}
	g := &t.groups[gi]
	b := g.blocksAt(generated)
	if b == g.blk || generated < g.gen {
		return
	}
	s := t.s
	s.mu.Lock()
	if t.weight == 0 {
		s.mu.Unlock()
		return
	}
	s.updateLocked(t, func() { g.gen, g.blk = generated, b })
	s.noteGrowthLocked(t, g)
	s.guardCheckLocked(t.gpu)
	s.settleUnlock(opProgress)
}

// Done reports that one sequence of group gi finished after generating
// generated tokens, capped saying whether its cap stopped it. Its blocks go
// back at once, and its length teaches the queue's predictor (also after
// Release: a sequence that finished is a sample whatever the client did).
func (t *Ticket) Done(gi, generated int, capped bool) {
	if t == nil || t.s == nil || gi < 0 || gi >= len(t.groups) || generated < 0 {
		return
	}
	s := t.s
	s.mu.Lock()
	if !t.pinned {
		s.observeLocked(t.line.q, t.tenant.name, t.line.name, generated, capped)
	}
	g := &t.groups[gi]
	if t.weight == 0 || g.live == 0 {
		s.mu.Unlock()
		return
	}
	s.noteFinishLocked(t, g)
	s.updateLocked(t, func() { g.live-- })
	s.settleUnlock(opShrink)
}

// updateLocked applies change to t's groups and moves every account that
// depends on them: the GPU's forecast, held weight and charge, the
// tenant's and the line's holdings, and the drain rate for what it gave up.
func (s *Scheduler) updateLocked(t *Ticket, change func()) {
	p := t.gpu
	s.forecastSubLocked(p, t)
	change()
	if t.lens == nil && len(t.groups) > 0 && !t.opaque && !t.pinned && !t.noResume {
		// Admitted while its queue was warming up: forecast it like the
		// rest as soon as the queue has learned enough (unless it cannot
		// be resumed: a forecast that turns out short would have the
		// guard fail it, so it stays at the worst case it came in at). It
		// takes no part in the change detector (its groups stay unjudged):
		// it is a survivor, picked for having run this long, so it grows
		// past its mark far more often than the mark says, however right
		// the forecast is (the warm-up's long requests all counted as
		// crossings at once and tripped the detector).
		t.lens = s.lengthsForLocked(t.line.q, t.tenant, t.line.name)
	}
	weight := int64(0)
	for i := range t.groups {
		g := &t.groups[i]
		weight = satAdd64(weight, g.size(g.live, g.Cap))
	}
	if weight == 0 {
		// Every sequence finished: everything goes back now, as on Release.
		s.unholdLocked(t, true)
		return
	}
	// The new forecast first: the charge is its peak (with the forecast
	// taken away above, it would be the worst case).
	s.forecastAddLocked(p, t)
	charge := s.ticketChargeLocked(t, weight)
	dw, dc := weight-t.weight, charge-t.charge
	p.held += dw
	if t.fixed() {
		p.fixedHeld += dw
	}
	p.charge += dc
	t.line.held += dw
	t.tenant.unholdLocked(p, t.charge, t.weight)
	t.tenant.holdLocked(p, charge, weight)
	t.weight, t.charge = weight, charge
	s.guardSetLocked(p, t, s.guardNowLocked(t))
	if dc < 0 {
		p.drain.add(-dc, s.clock)
		s.noteDemandLocked(p)
	}
}

// ErrNotHeld is Move's error for a ticket that holds nothing.
var ErrNotHeld = errors.New("admission: the ticket holds nothing")

// Move gives up the ticket's GPU (its backend failed before answering)
// and waits, at the request's place in its queue, to be bound to another
// of its queue's GPUs; the one it leaves is excluded. The request starts
// over: its progress is forgotten. On success the ticket is bound again
// (GPU says where); on failure — a refusal (ErrNoRoute when no other GPU
// is available), or ctx ending — it holds nothing. It is never held twice:
// the old GPU is given back before the new one is sought.
func (t *Ticket) Move(ctx context.Context) error {
	if t == nil || t.s == nil {
		return ErrNotHeld
	}
	s := t.s
	s.mu.Lock()
	if t.weight == 0 {
		s.mu.Unlock()
		return ErrNotHeld
	}
	old := t.gpu
	w := &waiter{t: t, line: t.line, tenant: t.tenant, opaque: t.opaque, pinned: t.pinned, noResume: t.noResume, stop: t.guard.stopper,
		lens: t.lens, seq: t.seq, exclude: old, affinity: t.affinity}
	for _, g := range t.groups {
		w.shape = append(w.shape, g.Group)
	}
	if len(w.shape) == 0 {
		w.weight = t.weight
	}
	s.unholdLocked(t, false)
	q := w.line.q
	if q.removed || w.line.index < 0 {
		return s.moveRefuseUnlock(w, ErrNoRoute)
	}
	if len(w.shape) > 0 {
		w.weight = WorstCaseBytes(w.shape)
		w.shared = sharedOf(w.shape)
		w.charge = s.chargeLocked(w)
	} else {
		w.charge = w.weight
	}
	if reason, _ := s.refusalLocked(w); reason != nil && reason != ErrOverloaded {
		return s.moveRefuseUnlock(w, reason)
	}
	now := s.clock.Now()
	w.enqueued = now
	w.ready = make(chan struct{})
	if to := w.line.spec.timeout; to > 0 {
		w.deadline = now.Add(to)
		w.timer = s.clock.AfterFunc(to, func() { s.expire(w) })
	}
	s.enqueueLocked(w)
	s.checkLocked(opMove)
	s.dispatchLocked()
	s.noteWaitingLocked(w)
	s.unlockNotify()
	_, err := s.wait(ctx, ctx.Done(), w)
	return err
}

func (s *Scheduler) moveRefuseUnlock(w *waiter, reason error) error {
	return s.rejectUnlock(reason, w, 0, 0)
}

// String is for logs and test failures.
func (t *Ticket) String() string {
	if t == nil || t.s == nil {
		return "ticket{}"
	}
	return fmt.Sprintf("ticket{queue %q, class %q, GPU %q, waited %v}", t.queue, t.class, t.gpuName, t.waited)
}
