package admission_test

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/admission"
)

// chat is a streamed chat request: a prompt and up to max output tokens, in
// blocks of 16 tokens of 16 bytes (a byte per token).
func chat(prompt, maxTokens int) admission.Request {
	return admission.Request{Shape: []admission.Group{{Prompt: prompt, Cap: maxTokens, Seqs: 1, BlockTokens: 16, BlockBytes: 16}}}
}

func predicted(capacity int64, warmup int) admission.Config {
	return oneGPU(capacity, admission.Config{Policy: admission.PolicyConfig{Reservation: admission.Predicted, WarmupSamples: warmup}})
}

// teach reports n finished sequences of the given length through a ticket
// of a request that ran and stopped on its own.
func (f *fixture) teach(n, length int) {
	f.t.Helper()
	for range n {
		tk := f.acquire(chat(0, length+1))
		tk.Done(0, length, false)
		if tk.Weight() != 0 {
			f.t.Fatalf("a finished single-sequence ticket still holds %d", tk.Weight())
		}
	}
}

// fillAtOnce admits copies of r until one does not fit at once (its
// deadline has passed, so it is refused rather than queued).
func (f *fixture) fillAtOnce(r admission.Request) []*admission.Ticket {
	r.Deadline = t0
	var tks []*admission.Ticket
	for {
		tk, err := f.b.Acquire(context.Background(), r)
		if err != nil {
			return tks
		}
		tks = append(tks, tk)
	}
}

// Until a queue has WarmupSamples finished sequences its requests are held
// at their worst case; once it has learned that outputs stop early, the
// same GPU admits several times as many, while its forecast stays within
// the capacity at every admission (the fixture checks that invariant).
func TestPredictedAdmitsByLearnedLengths(t *testing.T) {
	const capacity = 64 * 1040 // 64 requests' worst case: 16-token prompt + 1024 output
	cfg := predicted(capacity, 50)
	cfg.Policy.MaxOvercommit = 16 // the exposure bound is TestGuardExposure's
	f := newFixture(t, cfg)
	fill := func() []*admission.Ticket { return f.fillAtOnce(chat(16, 1024)) }
	release := func(tks []*admission.Ticket) {
		for _, tk := range tks {
			tk.Release()
		}
	}
	cold := fill()
	if len(cold) != 64 {
		t.Fatalf("warming up: admitted %d, want the worst case's 64", len(cold))
	}
	release(cold)
	f.teach(49, 100)
	short := fill()
	if len(short) != 64 {
		t.Fatalf("one sample short of the warm-up: admitted %d", len(short))
	}
	release(short)
	f.teach(1, 100)
	warm := fill()
	// Every output stops at 100 tokens: a request holds 16 + 100 (+ the
	// lead) tokens at its peak, 8 blocks of the 65 of its worst case.
	t.Logf("admitted %d after learning (64 at worst case)", len(warm))
	if len(warm) < 400 {
		t.Fatalf("after learning: admitted %d, want several times 64", len(warm))
	}
	st := f.b.Stats()
	if st.Committed > st.Effective || st.Held <= st.Effective {
		t.Fatalf("committed %d of effective %d, worst case held %d", st.Committed, st.Effective, st.Held)
	}
	// Progress and completion keep the forecast honest: as they run and
	// finish, the next ones get in.
	w := f.enqueue(context.Background(), chat(16, 1024))
	for i, tk := range warm {
		tk.Progress(0, 50)
		if i%2 == 0 {
			tk.Done(0, 100, false)
		}
	}
	f.admitted(w).Release()
	release(warm)
	f.state(0, 0)
}

// A request whose progress is not reported (a non-streamed answer) is held
// at its worst case from admission to release, even once its queue has
// learned: the gateway cannot see it grow, nor stop it part way, so no
// forecast of it could be corrected before the backend ran out. Its
// length still teaches.
func TestPredictedOpaqueRequests(t *testing.T) {
	f := newFixture(t, predicted(1<<20, 10))
	f.teach(10, 100)
	opaque := f.acquire(admission.Request{Shape: chat(16, 1024).Shape, Opaque: true})
	// 16 + 1024 tokens at worst: 65 blocks of 16 bytes each.
	if st := f.b.Scheduler.Stats().GPUs[0]; st.Committed != 65*16 || st.Charge != 65*16 || st.Now != 65*16 {
		t.Fatalf("opaque request: committed %d, charged %d, now %d, want 1040", st.Committed, st.Charge, st.Now)
	}
	opaque.Progress(0, 90) // progress of an opaque ticket changes nothing
	if st := f.b.Scheduler.Stats().GPUs[0]; st.Committed != 65*16 || st.Charge != 65*16 {
		t.Fatalf("after progress: committed %d, charged %d", st.Committed, st.Charge)
	}
	before := f.b.Scheduler.Stats().Queues[0].Samples
	opaque.Done(0, 300, false)
	if after := f.b.Scheduler.Stats().Queues[0].Samples; after != before+1 {
		t.Fatalf("a finished opaque request taught %v samples, want 1", after-before)
	}
	f.state(0, 0)
}

// The backend's own report is ground truth: while it says the GPU is
// fuller than (1 − headroom) × capacity, nothing new gets in on the
// forecast's word; when it says otherwise, the waiters go.
func TestPredictedUsageGate(t *testing.T) {
	f := newFixture(t, predicted(10000, 10))
	s := f.b.Scheduler
	f.teach(10, 100)
	// Ten long requests: their worst cases (10 × 1040) are past the
	// capacity, so what comes next is admitted by the forecast alone.
	var long []*admission.Ticket
	for range 10 {
		long = append(long, f.acquire(chat(16, 1024)))
	}
	defer func() {
		for _, tk := range long {
			tk.Release()
		}
	}()
	if err := s.SetUsage(gpu, 9900, true); err != nil { // over 98%
		t.Fatal(err)
	}
	w := f.enqueue(context.Background(), chat(16, 100))
	if st := s.Stats().GPUs[0]; !st.Gated || st.Used != 9900 {
		t.Fatalf("gate: %+v", st)
	}
	if err := s.SetUsage(gpu, 5000, true); err != nil {
		t.Fatal(err)
	}
	f.admitted(w).Release()
	if err := s.SetUsage(gpu, 9900, false); err != nil { // not known: no gate
		t.Fatal(err)
	}
	f.acquire(chat(16, 100)).Release()
	if err := s.SetUsage("nope", 1, true); err == nil {
		t.Fatal("SetUsage of an unknown GPU accepted")
	}
}

// A request whose worst case fits beside every worst case held is safe
// whatever the backend reports, as under WorstCase: the gate does not hold
// it. A GPU whose part of the GPU is a lease (a shared budget) is gated
// all the same: the report is the whole GPU's, other replicas' forecasts
// included.
func TestPredictedWorstCaseFitPassesTheGate(t *testing.T) {
	f := newFixture(t, predicted(10000, 10))
	s := f.b.Scheduler
	f.teach(10, 100)
	if err := s.SetUsage(gpu, 9900, true); err != nil {
		t.Fatal(err)
	}
	f.acquire(chat(16, 100)).Release()
	f.setLimit(gpu, 10000)
	w := f.enqueue(context.Background(), chat(16, 100))
	if err := s.SetUsage(gpu, 5000, true); err != nil {
		t.Fatal(err)
	}
	f.admitted(w).Release()
	f.state(0, 0)
}

// Under WorstCase the backend's report closes nothing: what is held bounds
// what can be used.
func TestWorstCaseIgnoresTheUsageGate(t *testing.T) {
	f := newFixture(t, oneGPU(10000, admission.Config{}))
	if err := f.b.Scheduler.SetUsage(gpu, 9999, true); err != nil {
		t.Fatal(err)
	}
	f.acquire(chat(16, 100)).Release()
}

// A tenant with enough samples of its own is predicted from them: a tenant
// whose outputs run long does not borrow the short outputs of the others.
func TestPredictedPerTenantLengths(t *testing.T) {
	f := newFixture(t, predicted(1<<20, 10))
	f.teach(90, 20) // the queue at large: mostly 20 tokens
	long := func() admission.Request {
		r := chat(0, 1000)
		r.Tenant = "essays"
		return r
	}
	for range 10 {
		tk := f.acquire(long())
		tk.Done(0, 900, false)
	}
	short := f.acquire(chat(0, 1000))
	shortCharge := f.b.Scheduler.Stats().GPUs[0].Charge
	short.Release()
	essay := f.acquire(long())
	essayCharge := f.b.Scheduler.Stats().GPUs[0].Charge
	essay.Release()
	if essayCharge <= 4*shortCharge {
		t.Fatalf("charge of a long-output tenant's request %d, of the queue's %d", essayCharge, shortCharge)
	}
}

// When every output runs to its cap (max_tokens pinned), the learned
// lengths are all censored at the caps and the forecast is exact: it has no
// margin of variance. The real memory must still never pass the GPU,
// although a ticket's curve is recomputed only when a sequence enters a new
// block (so it is up to a block stale) — a step by step engine checks it.
func TestPredictedExactLengthsNeverOverflow(t *testing.T) {
	for _, tc := range []struct {
		name          string
		taught, capAt int
	}{
		{"learned at the caps", 20, 128},
		// A client that asks for 4 tokens at a time teaches only that outputs
		// run past 4: that must not make longer requests look short.
		{"learned from tiny caps", 250, 4},
	} {
		t.Run(tc.name, func(t *testing.T) { exactLengths(t, tc.taught, tc.capAt) })
	}
}

func exactLengths(t *testing.T, taught, capAt int) {
	const blocks = 1000
	f := newFixture(t, predicted(blocks*16, 20)) // blocks of 16 tokens, a byte each
	for range taught {
		f.acquire(chat(100, capAt)).Done(0, capAt, true)
	}
	e := &engine{f: f}
	realBlocks := func() int {
		n := 0
		for _, r := range e.running {
			n += (r.prompt + r.g + 1 + 15) / 16 // the token being computed has its slot
		}
		return n
	}
	x := uint32(7)
	peak := 0
	for step := range 3000 {
		for len(e.pending) < 4 { // a queue that never empties
			x = x*1103515245 + 12345
			e.arrive("chat", chat(20+int(x>>8)%400, []int{128, 512}[(x>>4)%2]))
		}
		e.settle()
		e.admitted = nil
		if b := realBlocks(); b > blocks {
			t.Fatalf("step %d: %d requests really hold %d blocks of the GPU's %d", step, len(e.running), b, blocks)
		} else {
			peak = max(peak, b)
		}
		e.step()
	}
	t.Logf("peak %d of %d blocks", peak, blocks)
	if peak < blocks*8/10 {
		t.Fatalf("the GPU was never filled: peak %d of %d blocks", peak, blocks)
	}
}

// A request that sets its own length (Pinned: ignore_eos, min_tokens, a
// resumed stream) is sized by it — every sequence runs to its cap — but as
// it grows, not at its end from the start: beside one that will finish
// before it reaches its own peak it fits, where two that grow together do
// not.
func TestPinnedGrowthIsCertain(t *testing.T) {
	pin := func() admission.Request {
		r := chat(0, 592) // 37 blocks of 16 bytes at its cap
		r.Pinned, r.Deadline = true, t0
		return r
	}
	for _, tc := range []struct {
		name  string
		ahead int // tokens the first has generated when the second arrives
		fits  bool
	}{
		{"beside one about to finish", 560, true},
		{"beside one just started", 0, false},
	} {
		f := newFixture(t, predicted(1000, 1))
		first := f.acquire(pin())
		first.Progress(0, tc.ahead)
		second, err := f.b.Acquire(context.Background(), pin())
		if (err == nil) != tc.fits {
			t.Errorf("%s: admitted %v (%v), want %v: worst cases 592 + 592 > 1000", tc.name, err == nil, err, tc.fits)
		}
		second.Release()
		first.Release()
		f.state(0, 0)
	}
}
