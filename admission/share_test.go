package admission_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
)

// prefixOf names the leading blocks of a prompt of family fam: two
// prompts of one family share their blocks up to the shorter one.
func prefixOf(fam uint64, blocks int) []uint64 {
	p := make([]uint64, blocks)
	for j := range p {
		p[j] = fam<<32 | uint64(j)
	}
	return p
}

// shared is a one-prompt request of prompt tokens (blocks of 16 tokens, 1
// byte each, so sizes read in blocks) whose leading blocks are family fam's.
func shared(fam uint64, prompt, out int) admission.Request {
	return admission.Request{Shape: []admission.Group{{Prompt: prompt, Cap: out, Seqs: 1, BlockTokens: 16, BlockBytes: 1,
		Prefix: prefixOf(fam, prompt/16)}}}
}

func sharingFixture(t *testing.T, capacity int64, policy string) *fixture {
	t.Helper()
	f := newFixture(t, oneGPU(capacity, admission.Config{Policy: admission.PolicyConfig{Reservation: policy}}))
	if err := f.b.SetSharing(gpu, true); err != nil {
		t.Fatal(err)
	}
	return f
}

func gpuStats(t *testing.T, s *admission.Scheduler) admission.GPUStats {
	t.Helper()
	st, ok := s.GPU(gpu)
	if !ok {
		t.Fatal("no GPU")
	}
	return st
}

// A prompt of 100 blocks + 4 tokens, 64 tokens out: 100 shareable blocks,
// and 5 of its own (its partial block and its output).
func TestSharedPromptBlocksAreHeldOnce(t *testing.T) {
	for _, policy := range []string{admission.WorstCase, admission.Predicted} {
		t.Run(policy, func(t *testing.T) {
			f := sharingFixture(t, 1000, policy)
			ctx := context.Background()
			a, err := f.b.Acquire(ctx, shared(1, 1604, 64))
			if err != nil {
				t.Fatal(err)
			}
			b, err := f.b.Acquire(ctx, shared(1, 1604, 64))
			if err != nil {
				t.Fatal(err)
			}
			c, err := f.b.Acquire(ctx, shared(2, 1604, 64)) // another prompt: nothing shared with them
			if err != nil {
				t.Fatal(err)
			}
			st := gpuStats(t, f.b.Scheduler)
			if st.Held != 100+5+5+100+5 || st.Shared != 200 || st.SharedSaved != 100 {
				t.Fatalf("held %d, shared %d, saved %d; want 215, 200, 100", st.Held, st.Shared, st.SharedSaved)
			}
			if a.Weight() != 5 || b.Weight() != 5 {
				t.Errorf("tickets hold %d and %d of their own, want 5", a.Weight(), b.Weight())
			}
			// The first holder leaves: the blocks stay, held by the second.
			a.Release()
			if st := gpuStats(t, f.b.Scheduler); st.Held != 100+5+100+5 || st.Shared != 200 || st.SharedSaved != 0 {
				t.Fatalf("after the first holder: held %d, shared %d, saved %d; want 210, 200, 0", st.Held, st.Shared, st.SharedSaved)
			}
			// The last holder leaves: they go.
			b.Release()
			c.Release()
			if st := gpuStats(t, f.b.Scheduler); st.Held != 0 || st.Shared != 0 {
				t.Fatalf("after every holder: held %d, shared %d", st.Held, st.Shared)
			}
		})
	}
}

// The last prompt token is always computed again (vLLM), so a prompt of
// exactly k blocks shares k−1 of them.
func TestTheLastPromptTokensBlockIsNeverShared(t *testing.T) {
	f := sharingFixture(t, 1000, admission.WorstCase)
	ctx := context.Background()
	for range 2 {
		if _, err := f.b.Acquire(ctx, shared(1, 160, 16)); err != nil { // 10 full blocks, 1 of output
			t.Fatal(err)
		}
	}
	if st := gpuStats(t, f.b.Scheduler); st.Shared != 9 || st.Held != 9+2*2 {
		t.Fatalf("shared %d, held %d; want 9 and 13 (each its last prompt block and its output block)", st.Shared, st.Held)
	}
}

// A request fits where its shared blocks are held already; when their
// holders end before it is admitted it needs its whole size again.
func TestAReservationGrowsBackWhenItsSharersEnd(t *testing.T) {
	f := sharingFixture(t, 220, admission.WorstCase)
	ctx := context.Background()
	a, err := f.b.Acquire(ctx, shared(1, 1604, 64)) // 105
	if err != nil {
		t.Fatal(err)
	}
	x, err := f.b.Acquire(ctx, admission.Request{Weight: 100})
	if err != nil {
		t.Fatal(err)
	}
	// 15 left: enough for b's own 5 beside a, not for its 105 alone.
	b, err := f.b.Acquire(ctx, shared(1, 1604, 64))
	if err != nil {
		t.Fatalf("b does not fit beside the request holding its prompt: %v", err)
	}
	b.Release()
	a.Release()
	// Now nobody holds the prompt: b needs 105 and 120 are free.
	bCh := make(chan error, 1)
	y, err := f.b.Acquire(ctx, admission.Request{Weight: 20}) // 100 free
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		tk, err := f.b.Acquire(ctx, shared(1, 1604, 64))
		if err == nil {
			defer tk.Release()
			if st, _ := f.b.GPU(gpu); st.Held != 20+105 {
				err = errNotWhole(st.Held)
			}
		}
		bCh <- err
	}()
	admissiontest.WaitQueued(f.b.Scheduler, 1)
	x.Release() // now 200 free
	if err := <-bCh; err != nil {
		t.Fatal(err)
	}
	y.Release()
}

type errNotWhole int64

func (e errNotWhole) Error() string {
	return fmt.Sprintf("held %d, want 125: the request's whole 105 beside the 20", int64(e))
}

// Without SetSharing a GPU counts every prompt whole, Prefix or not.
func TestAGPUThatDoesNotShareCountsEveryPromptWhole(t *testing.T) {
	f := newFixture(t, oneGPU(1000, admission.Config{}))
	ctx := context.Background()
	for range 2 {
		if _, err := f.b.Acquire(ctx, shared(1, 1604, 64)); err != nil {
			t.Fatal(err)
		}
	}
	if st := gpuStats(t, f.b.Scheduler); st.Held != 210 || st.Shared != 0 {
		t.Fatalf("held %d, shared %d; want 210, 0", st.Held, st.Shared)
	}
}

// Among GPUs with room, a request goes where its prompt is held already.
func TestARequestGoesWhereItsPromptIsHeld(t *testing.T) {
	cfg := admission.Config{
		GPUs:   []admission.GPUConfig{{Name: "a", Capacity: 1000}, {Name: "b", Capacity: 2000}},
		Queues: []admission.QueueConfig{{Name: "", GPUs: []string{"a", "b"}}},
		Clock:  admissiontest.NewClock(t0),
	}
	s, err := admission.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"a", "b"} {
		if err := s.SetSharing(g, true); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	first, err := s.Acquire(ctx, shared(1, 1604, 64))
	if err != nil {
		t.Fatal(err)
	}
	if first.GPU() != "b" {
		t.Fatalf("the first went to %q, want b (the most room)", first.GPU())
	}
	for i := range 5 {
		tk, err := s.Acquire(ctx, shared(1, 1604, 64))
		if err != nil {
			t.Fatal(err)
		}
		if tk.GPU() != "b" {
			t.Fatalf("request %d went to %q, not to b where its prompt is held", i, tk.GPU())
		}
	}
}
