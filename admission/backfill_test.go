package admission_test

import (
	"context"
	"runtime"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/internal/confval"
)

// job is a request of the given weight that runs the given number of steps
// (tokens), in one-token blocks of one byte: its prompt makes up the rest
// of its weight.
func job(weight, steps int) admission.Request {
	return admission.Request{Shape: []admission.Group{{Prompt: weight - steps, Cap: steps, Seqs: 1, BlockTokens: 1, BlockBytes: 1}}}
}

// engine steps admitted jobs the way a backend does: one token per running
// request per step, each finishing at its cap.
type engine struct {
	f        *fixture
	running  []*running
	pending  []pending
	admitted []string // names admitted since the caller last took them
}

type running struct {
	tk     *admission.Ticket
	steps  int
	g      int
	prompt int
	name   string
}

type pending struct {
	ch     <-chan result
	steps  int
	prompt int
	name   string
}

// arrive submits r; it may be admitted at once or queue.
func (e *engine) arrive(name string, r admission.Request) {
	ch := make(chan result, 1)
	go func() {
		tk, err := e.f.b.Acquire(context.Background(), r)
		ch <- result{tk, err}
	}()
	e.pending = append(e.pending, pending{ch, r.Shape[0].Cap, r.Shape[0].Prompt, name})
	e.settle()
}

// settle collects every admission decided so far: grants are made under
// the scheduler's lock, and the waiting goroutines hand them over, so it
// waits until what is neither received nor queued has arrived.
func (e *engine) settle() {
	for {
		left := e.pending[:0]
		for _, p := range e.pending {
			select {
			case res := <-p.ch:
				if res.err != nil {
					e.f.t.Fatalf("%s refused: %v", p.name, res.err)
				}
				e.running = append(e.running, &running{tk: res.tk, steps: p.steps, prompt: p.prompt, name: p.name})
				e.admitted = append(e.admitted, p.name)
			default:
				left = append(left, p)
			}
		}
		e.pending = left
		if len(e.pending) == e.f.b.Stats().Queued {
			return
		}
		runtime.Gosched()
	}
}

// step runs one step: every running job gains a token; those at their cap
// finish.
func (e *engine) step() {
	left := e.running[:0]
	for _, r := range e.running {
		r.g++
		if r.g >= r.steps {
			r.tk.Done(0, r.g, true)
			continue
		}
		r.tk.Progress(0, r.g)
		left = append(left, r)
	}
	e.running = left
}

// A head that needs half the budget waits for two of four long requests
// (a fifth of the budget each) to finish;
// short requests arrive behind it, one a step. With backfilling, shorts
// start while the head waits — and the head starts no later than it does
// in strict order.
func TestBackfillStartsShortsWithoutDelayingTheHead(t *testing.T) {
	run := func(backfill bool) (headStart, shortsBefore int) {
		f := newFixture(t, oneGPU(1000, admission.Config{Backfill: admission.BackfillConfig{Enabled: new(backfill), MaxHeadAge: confval.Duration{D: -1}}}))
		e := &engine{f: f}
		for _, steps := range []int{10, 20, 30, 40} {
			e.arrive("long", job(200, steps))
		}
		e.arrive("head", job(500, 50))
		headStart = -1
		for step := 0; step < 200 && (headStart < 0 || len(e.running) > 0); step++ {
			if step < 60 {
				e.arrive("short", job(100, 5))
			}
			e.settle()
			// Those admitted in one step are told in the order their
			// goroutines hand them over, not the order they were granted:
			// a short admitted beside the head is not one before it.
			if slices.Contains(e.admitted, "head") {
				headStart = step
			} else if headStart < 0 {
				for _, name := range e.admitted {
					if name == "short" {
						shortsBefore++
					}
				}
			}
			e.admitted = nil
			e.step()
		}
		for len(e.pending) > 0 || len(e.running) > 0 {
			e.step()
			e.settle()
		}
		f.state(0, 0)
		return headStart, shortsBefore
	}
	strictStart, strictShorts := run(false)
	start, shorts := run(true)
	t.Logf("strict: head starts at step %d after %d shorts; backfilling: step %d after %d shorts",
		strictStart, strictShorts, start, shorts)
	if strictStart != 20 || strictShorts != 0 {
		t.Fatalf("strict order: head at %d after %d shorts, want 20 after none", strictStart, strictShorts)
	}
	if start > strictStart {
		t.Fatalf("backfilling delayed the head to step %d (strict: %d)", start, strictStart)
	}
	if shorts < 10 {
		t.Fatalf("backfilling started %d shorts while the head waited, strict %d", shorts, strictShorts)
	}
	if bf := newFixture(t, oneGPU(1, admission.Config{})).b.Stats().Backfilled; bf != 0 {
		t.Fatalf("a fresh scheduler reports %d backfilled", bf)
	}
}

// Once the head has waited MaxHeadAge nobody passes it any more.
func TestAgedHeadBlocksBackfilling(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{Backfill: admission.BackfillConfig{MaxHeadAge: confval.Duration{D: 1000}}}))
	long := f.acquire(job(60, 50))
	head := f.enqueue(context.Background(), job(50, 10))
	short := f.acquire(job(10, 5)) // finishes long before the head could start: passes
	if s := f.b.Stats(); s.Backfilled != 1 {
		t.Fatalf("backfilled %d", s.Backfilled)
	}
	short.Release()
	f.clock.Advance(1000)
	blocked := f.enqueue(context.Background(), job(10, 5)) // the head is old now: it waits
	if st := f.b.Stats().GPUs[0]; !st.Blocking {
		t.Fatalf("aged head: %+v", st)
	}
	long.Release()
	f.admitted(head).Release()
	f.admitted(blocked).Release()
	f.state(0, 0)
}
