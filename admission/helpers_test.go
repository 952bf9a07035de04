package admission_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// gpu is the GPU of a one-GPU scheduler; its one queue is "".
const gpu = "gpu"

// oneGPU is c for one GPU of the given capacity and one queue.
func oneGPU(capacity int64, c admission.Config) admission.Config {
	c.GPUs = []admission.GPUConfig{{Name: gpu, Capacity: capacity}}
	c.Queues = []admission.QueueConfig{{Name: "", GPUs: []string{gpu}}}
	return c
}

// budget is a one-GPU scheduler seen as one budget: the GPU's figures
// flattened into its stats, and its GPU named for it.
type budget struct{ *admission.Scheduler }

type flatStats struct {
	admission.Stats
	Capacity, Effective, Held, Committed, QueuedBytes int64
	DrainRate                                         float64
	Classes                                           []admission.ClassStats
}

func (b budget) Stats() flatStats {
	st := b.Scheduler.Stats()
	p, q := st.GPUs[0], st.Queues[0]
	return flatStats{Stats: st, Capacity: p.Capacity, Effective: p.Effective, Held: p.Held, Committed: p.Committed,
		QueuedBytes: q.QueuedBytes, DrainRate: p.DrainRate, Classes: q.Classes}
}

func (b budget) Resize(capacity int64) error { return b.Scheduler.Resize(gpu, capacity) }

func (b budget) Feedback(over bool) {
	if err := b.Scheduler.Feedback(gpu, over); err != nil {
		panic(err)
	}
}

// Free is what a new request could take at once if nobody waits.
func (b budget) Free() int64 {
	p := b.Stats()
	return p.Effective - p.Committed
}

// fixture is a one-GPU scheduler on a manual clock, with a transcript of
// its observer and every invariant checked after every change of state.
type fixture struct {
	t     *testing.T
	clock *admissiontest.Clock
	rec   *admissiontest.Recorder
	b     budget
}

func newFixture(t *testing.T, cfg admission.Config) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: admissiontest.NewClock(t0), rec: &admissiontest.Recorder{}}
	cfg.Clock, cfg.Observer = f.clock, f.rec
	s, err := admission.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	admission.SetCheck(s, func(op string, err error) {
		if err != nil {
			t.Errorf("invariant broken: %v", err)
		}
	})
	f.b = budget{s}
	return f
}

type result struct {
	tk  *admission.Ticket
	err error
}

// acquire must be admitted at once.
func (f *fixture) acquire(r admission.Request) *admission.Ticket {
	f.t.Helper()
	tk, err := f.b.Acquire(context.Background(), r)
	if err != nil {
		f.t.Fatalf("Acquire(%+v): %v", r, err)
	}
	if tk.Weight() != weightOf(r) || tk.Waited() != 0 {
		f.t.Fatalf("Acquire(%+v): ticket weight %d waited %v", r, tk.Weight(), tk.Waited())
	}
	return tk
}

// reject must be refused at once with reason.
func (f *fixture) reject(r admission.Request, reason error) *admission.RejectError {
	f.t.Helper()
	before := f.b.Stats().Queued
	ch := make(chan result, 1)
	go func() {
		tk, err := f.b.Acquire(context.Background(), r)
		ch <- result{tk, err}
	}()
	for {
		select {
		case res := <-ch:
			var re *admission.RejectError
			if !errors.As(res.err, &re) || !errors.Is(res.err, reason) {
				f.t.Fatalf("Acquire(%+v) = %v, %v; want a refusal with %v", r, res.tk, res.err, reason)
			}
			if q := f.b.Stats().Queued; q != before {
				f.t.Fatalf("a refusal changed the queue: %d -> %d", before, q)
			}
			return re
		default:
			if q := f.b.Stats().Queued; q > before {
				f.t.Fatalf("Acquire(%+v) queued; want a refusal with %v", r, reason)
			}
			runtime.Gosched()
		}
	}
}

// enqueue starts an Acquire that must queue, and returns once it has.
func (f *fixture) enqueue(ctx context.Context, r admission.Request) <-chan result {
	f.t.Helper()
	n := f.b.Stats().Queued
	ch := make(chan result, 1)
	go func() {
		tk, err := f.b.Acquire(ctx, r)
		ch <- result{tk, err}
	}()
	admissiontest.WaitQueued(f.b.Scheduler, n+1)
	return ch
}

// admitted receives a queued Acquire's result, which must be a ticket.
// It hangs (until the test timeout) if the waiter is never admitted.
func (f *fixture) admitted(ch <-chan result) *admission.Ticket {
	f.t.Helper()
	res := <-ch
	if res.err != nil {
		f.t.Fatalf("queued Acquire failed: %v", res.err)
	}
	return res.tk
}

// refused receives a queued Acquire's result, which must be a refusal.
func (f *fixture) refused(ch <-chan result, reason error) *admission.RejectError {
	f.t.Helper()
	res := <-ch
	var re *admission.RejectError
	if !errors.As(res.err, &re) || !errors.Is(res.err, reason) {
		f.t.Fatalf("queued Acquire = %v, %v; want a refusal with %v", res.tk, res.err, reason)
	}
	return re
}

// state asserts the held weight and the queue length. Both are updated
// under the budget's lock before any waiter is woken, so they are exact
// right after the call that changed them.
func (f *fixture) state(held int64, queued int) {
	f.t.Helper()
	s := f.b.Stats()
	if s.Held != held || s.Queued != queued {
		f.t.Fatalf("held %d queued %d, want held %d queued %d", s.Held, s.Queued, held, queued)
	}
}

// stillQueued asserts that no result has arrived on chs. On its own it
// could miss a wrong grant whose goroutine has not sent yet, so tests pair it
// with state, which is exact.
func (f *fixture) stillQueued(chs ...<-chan result) {
	f.t.Helper()
	for _, ch := range chs {
		select {
		case res := <-ch:
			f.t.Fatalf("expected still queued, got %v, %v", res.tk, res.err)
		default:
		}
	}
}

// strictOrder disables backfilling: first come, first served.
var strictOrder = admission.BackfillConfig{Enabled: new(false)}

func std(w int64) admission.Request { return admission.Request{Weight: w} }

// chunks is a request of n sequences of each tokens in one-token blocks of
// one byte, without a prompt: it holds n × each, and each sequence that
// finishes (done) gives back each.
func chunks(n, each int) admission.Request {
	return admission.Request{Shape: []admission.Group{{Cap: each, Seqs: n, BlockTokens: 1, BlockBytes: 1}}}
}

// done finishes k sequences of a chunks ticket.
func done(tk *admission.Ticket, k int) {
	for range k {
		tk.Done(0, 1, false)
	}
}

// weightOf is the worst case of r.
func weightOf(r admission.Request) int64 {
	if len(r.Shape) == 0 {
		return r.Weight
	}
	var w int64
	for _, g := range r.Shape {
		shared := int64(g.Prompt / g.BlockTokens)
		own := int64((g.Prompt+g.Cap+g.BlockTokens-1)/g.BlockTokens) - shared
		w += (shared + int64(g.Seqs)*own) * g.BlockBytes
	}
	return w
}

func req(class, tenant string, w int64) admission.Request {
	return admission.Request{Weight: w, Class: class, Tenant: tenant}
}

func testingProcs() int { return runtime.GOMAXPROCS(0) }
