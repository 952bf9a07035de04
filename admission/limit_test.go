package admission_test

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
)

func (f *fixture) setLimit(gpu string, limit int64) {
	f.t.Helper()
	if err := f.b.SetLimit(gpu, limit); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) demand(gpu string, held, queued int64) {
	f.t.Helper()
	if h, q := f.b.Demand(gpu); h != held || q != queued {
		f.t.Fatalf("Demand(%q) = %d held, %d queued; want %d, %d", gpu, h, q, held, queued)
	}
}

// Admissions are measured against min(effective, limit): whichever is lower
// binds, a negative limit is none, and the fixture's invariant check
// verifies every admission against the same bound.
func TestSetLimitCapsAdmissions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		over     int   // Feedback(true) calls before: each halves the effective capacity of 100
		limit    int64 // SetLimit before
		held     []int64
		w        int64
		atOnce   bool
		wantFree int64
	}{
		{name: "no limit", limit: -1, held: []int64{60}, w: 40, atOnce: true, wantFree: 40},
		{name: "limit binds", limit: 50, held: []int64{30}, w: 30, atOnce: false, wantFree: 20},
		{name: "fits the limit exactly", limit: 50, held: []int64{30}, w: 20, atOnce: true, wantFree: 20},
		{name: "effective binds", over: 1, limit: 80, held: []int64{40}, w: 20, atOnce: false, wantFree: 10},
		{name: "limit zero closes the GPU", limit: 0, w: 1, atOnce: false, wantFree: 0},
		{name: "a limit above capacity changes nothing", limit: 1000, held: []int64{90}, w: 20, atOnce: false, wantFree: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, oneGPU(100, admission.Config{AIMD: admission.AIMDConfig{Decrease: 0.5}}))
			for range tc.over {
				f.b.Feedback(true)
			}
			f.setLimit(gpu, tc.limit)
			var tks []*admission.Ticket
			for _, w := range tc.held {
				tks = append(tks, f.acquire(std(w)))
			}
			if free := f.b.Scheduler.Free(gpu); free != tc.wantFree {
				t.Errorf("Free = %d, want %d", free, tc.wantFree)
			}
			if tc.atOnce {
				tks = append(tks, f.acquire(std(tc.w)))
			} else {
				ctx, cancel := context.WithCancel(context.Background())
				ch := f.enqueue(ctx, std(tc.w))
				cancel()
				if res := <-ch; res.err == nil {
					t.Fatal("the queued request was admitted after its context ended")
				}
			}
			for _, tk := range tks {
				tk.Release()
			}
			f.state(0, 0)
		})
	}
}

// Raising the limit admits the waiters that now fit before SetLimit
// returns; lowering it revokes nothing, and admissions stop until what is
// held is back under it.
func TestSetLimitRaisesAtOnceAndNeverRevokes(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{}))
	f.setLimit(gpu, 40)
	a := f.acquire(std(40))
	w1 := f.enqueue(context.Background(), std(30))
	w2 := f.enqueue(context.Background(), std(30))
	f.setLimit(gpu, 70)
	f.state(70, 1) // exact on return: w1 is bound, w2 still waits
	b := f.admitted(w1)
	f.stillQueued(w2)

	f.setLimit(gpu, 20) // below the 70 held: nothing is taken back
	f.state(70, 1)
	if st, _ := f.b.GPU(gpu); st.Limit != 20 || st.Held != 70 {
		t.Fatalf("after lowering: %+v", st)
	}
	a.Release() // 30 held, still over 20: w2 waits
	f.state(30, 1)
	f.stillQueued(w2)
	f.setLimit(gpu, -1) // no limit: the capacity of 100 binds
	f.admitted(w2).Release()
	b.Release()
	if st, _ := f.b.GPU(gpu); st.Limit != -1 {
		t.Fatalf("limit after SetLimit(-1) = %d, want -1 (none)", st.Limit)
	}
	if err := f.b.SetLimit("nope", 1); err == nil {
		t.Fatal("SetLimit on an unknown GPU: no error")
	}
}

// Demand is held (what the GPU has committed) and queued (the charge of
// every waiter that may be bound to it). A waiter of a queue with two GPUs
// counts on both; a queue whose route to the GPU is down counts on none.
func TestDemand(t *testing.T) {
	f := newFixture(t, fleet(
		[]admission.GPUConfig{{Name: "a", Capacity: 100}, {Name: "b", Capacity: 100}},
		map[string][]string{"both": {"a", "b"}, "onlyA": {"a"}, "onlyB": {"b"}},
		admission.Config{Limited: true}))
	type want struct{ aHeld, aQueued, bHeld, bQueued int64 }
	check := func(step string, w want) {
		t.Helper()
		for _, p := range []struct {
			name         string
			held, queued int64
		}{{"a", w.aHeld, w.aQueued}, {"b", w.bHeld, w.bQueued}} {
			if h, q := f.b.Demand(p.name); h != p.held || q != p.queued {
				t.Fatalf("%s: Demand(%q) = %d, %d; want %d, %d", step, p.name, h, q, p.held, p.queued)
			}
		}
	}
	check("empty", want{})
	// Limited: both GPUs start closed, so everything queues.
	both := f.enqueue(context.Background(), in("both", 10))
	f.clock.Advance(time.Second)
	onlyA := f.enqueue(context.Background(), in("onlyA", 20))
	onlyB := f.enqueue(context.Background(), in("onlyB", 40))
	f.clock.Advance(time.Second)
	check("three waiters", want{0, 30, 0, 50})
	// Head: the request that has waited longest among those that may bind
	// to the GPU.
	head := func(gpu string, charge int64, waited time.Duration) {
		t.Helper()
		if c, w := f.b.Head(gpu); c != charge || w != waited {
			t.Fatalf("Head(%q) = %d, %v; want %d, %v", gpu, c, w, charge, waited)
		}
	}
	head("a", 10, 2*time.Second)
	head("b", 10, 2*time.Second)
	f.setLimit("a", 25) // binds "both" (first come) on a; onlyA's 20 no longer fits
	f.admitted(both)
	check("a opened to 25", want{10, 20, 0, 40})
	head("a", 20, time.Second)
	head("b", 40, time.Second)
	head("nope", 0, 0)
	if err := f.b.SetAvailable("onlyB", "b", false); err != nil { // its waiter is refused: no route
		t.Fatal(err)
	}
	f.refused(onlyB, admission.ErrNoRoute)
	check("onlyB's route down", want{10, 20, 0, 0})
	f.setLimit("a", -1)
	f.admitted(onlyA)
	check("everything bound", want{30, 0, 0, 0})
	if h, q := f.b.Demand("nope"); h != 0 || q != 0 {
		t.Fatalf("Demand of an unknown GPU = %d, %d", h, q)
	}
}

// Under Predicted, Demand is in the units admissions are measured in: the
// forecast peak, below the worst case held.
func TestDemandIsCommittedUnderPredicted(t *testing.T) {
	f := newFixture(t, predicted(1<<20, 10))
	f.teach(10, 100)
	tk := f.acquire(chat(16, 1024))
	st, _ := f.b.GPU(gpu)
	if st.Committed >= st.Held {
		t.Fatalf("committed %d, held %d: the test needs a forecast below the worst case", st.Committed, st.Held)
	}
	f.demand(gpu, st.Committed, 0)
	tk.Release()
	f.demand(gpu, 0, 0)
}

// OnDemand runs outside the lock (the hook below calls back into the
// scheduler, which would deadlock under it), once per GPU per event: when
// a request queues for lack of room there, and when weight is given back —
// not when a request is admitted at once.
func TestOnDemand(t *testing.T) {
	calls := make(chan string, 16)
	var s *admission.Scheduler
	cfg := fleet([]admission.GPUConfig{{Name: "a", Capacity: 100}, {Name: "b", Capacity: 100}},
		map[string][]string{"both": {"a", "b"}}, admission.Config{Limited: true})
	cfg.OnDemand = func(gpu string) {
		s.Demand(gpu) // deadlocks if called under the scheduler's lock
		calls <- gpu
	}
	f := newFixture(t, cfg)
	s = f.b.Scheduler
	// take receives the calls want expects (the one after a queued request
	// comes from that request's goroutine, so it is waited for), then
	// checks that there is no other: every other call is made before the
	// method that causes it returns.
	take := func(step string, want ...string) {
		t.Helper()
		var got []string
		for range want {
			got = append(got, <-calls)
		}
		select {
		case c := <-calls:
			got = append(got, c)
		default:
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: OnDemand calls %q, want %q", step, got, want)
		}
	}
	w := f.enqueue(context.Background(), in("both", 30))
	take("a request queued on two closed GPUs", "a", "b")
	f.setLimit("a", 50)
	tk := f.admitted(w)
	take("SetLimit: the limiter's own call") // nothing: it knows
	tk2 := f.acquire(in("both", 20))
	take("admitted at once")
	tk.Release()
	take("a release", "a")
	tk2.Release()
	tk.Release() // the second Release does nothing
	take("the last release", "a")
}

// With Limited, a GPU that Reconfigure adds starts closed too; GPUs that
// stay keep their limit.
func TestLimitedGPUsAddedByReconfigure(t *testing.T) {
	cfg := fleet([]admission.GPUConfig{{Name: "a", Capacity: 100}}, map[string][]string{"q": {"a"}}, admission.Config{Limited: true})
	f := newFixture(t, cfg)
	if st, _ := f.b.GPU("a"); st.Limit != 0 {
		t.Fatalf("a new GPU of a Limited scheduler has limit %d, want 0", st.Limit)
	}
	f.setLimit("a", 60)
	if err := f.b.Reconfigure(fleet([]admission.GPUConfig{{Name: "a", Capacity: 100}, {Name: "b", Capacity: 100}},
		map[string][]string{"q": {"a", "b"}}, admission.Config{})); err != nil {
		t.Fatal(err)
	}
	for gpu, want := range map[string]int64{"a": 60, "b": 0} {
		if st, _ := f.b.GPU(gpu); st.Limit != want {
			t.Errorf("after Reconfigure: GPU %q limit %d, want %d", gpu, st.Limit, want)
		}
	}
}

// A replica running one of k equal, independent batches on a GPU keeps the
// GPU's ε with a margin of 1/√k: the same GPU admits more at a lower
// margin, a waiter that fits under the lower margin is admitted by
// SetMargin itself, and raising the margin back revokes nothing.
func TestSetMarginScalesTheForecastMargin(t *testing.T) {
	const capacity = 40 * 1040 // 40 requests' worst case: 16-token prompt + 1024 output
	f := newFixture(t, predicted(capacity, 20))
	// Lengths with spread, so that the margin is a good part of the bound.
	for i := range 40 {
		f.teach(1, []int{20, 400}[i%2])
	}
	fill := func() []*admission.Ticket { return f.fillAtOnce(chat(16, 1024)) }
	full := fill()
	if st, _ := f.b.GPU(gpu); st.Margin != 1 {
		t.Fatalf("default margin %v, want 1", st.Margin)
	}
	w := f.enqueue(context.Background(), chat(16, 1024))
	if err := f.b.SetMargin(gpu, 1/math.Sqrt(3)); err != nil {
		t.Fatal(err)
	}
	third := append(fill(), f.admitted(w))
	t.Logf("margin 1: %d admitted; margin 1/√3: %d more", len(full), len(third))
	if len(third) < 2 {
		t.Fatalf("a margin of 1/√3 admitted %d more than the full one; want several", len(third))
	}
	st, _ := f.b.GPU(gpu)
	if st.Margin != 1/math.Sqrt(3) || st.Committed > st.Effective {
		t.Fatalf("after the lower margin: margin %v, committed %d of %d", st.Margin, st.Committed, st.Effective)
	}
	// Back to the full margin: the commitments stand over the capacity,
	// nothing new gets in until they are back under it.
	if err := f.b.SetMargin(gpu, 1); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.b.GPU(gpu); st.Committed <= st.Effective {
		t.Fatalf("the full margin again: committed %d of %d; the test needs it over", st.Committed, st.Effective)
	}
	if tks := fill(); len(tks) != 0 {
		t.Fatalf("admitted %d over the capacity after the margin went back up", len(tks))
	}
	for _, tk := range append(full, third...) {
		tk.Release()
	}
	f.state(0, 0)

	for _, tc := range []struct {
		scale, want float64
	}{{0, 1.0 / 16}, {-1, 1.0 / 16}, {2, 1}, {0.5, 0.5}} {
		if err := f.b.SetMargin(gpu, tc.scale); err != nil {
			t.Fatal(err)
		}
		if st, _ := f.b.GPU(gpu); st.Margin != tc.want {
			t.Errorf("SetMargin(%v): margin %v, want %v", tc.scale, st.Margin, tc.want)
		}
	}
	if err := f.b.SetMargin("nope", 0.5); err == nil {
		t.Error("SetMargin on an unknown GPU: no error")
	}
	if err := f.b.SetMargin(gpu, math.NaN()); err == nil {
		t.Error("SetMargin(NaN): no error")
	}
}

// Issue 26, R2: a limit from a lease is trusted until its horizon. Past it
// nothing new is admitted, however soon the holder's own timer would have
// noticed, until the limit is confirmed with a new horizon; what is held
// stays held; a limit without a horizon never lapses.
func TestLimitHorizon(t *testing.T) {
	for _, tc := range []struct {
		name    string
		until   time.Duration // from now; 0: no horizon
		advance time.Duration
		atOnce  bool
	}{
		{"before the horizon", time.Second, 999 * time.Millisecond, true},
		{"at the horizon", time.Second, time.Second, false},
		{"past the horizon", time.Second, time.Hour, false},
		{"no horizon", 0, time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, oneGPU(100, admission.Config{}))
			var until time.Time
			if tc.until > 0 {
				until = f.clock.Now().Add(tc.until)
			}
			if err := f.b.SetLimitUntil(gpu, 50, until); err != nil {
				t.Fatal(err)
			}
			a := f.acquire(std(20))
			f.clock.Advance(tc.advance)
			if tc.atOnce {
				f.acquire(std(20)).Release()
				a.Release()
				f.state(0, 0)
				return
			}
			w := f.enqueue(context.Background(), std(20))
			f.state(20, 1) // held stays held
			f.stillQueued(w)
			// Confirmed: a new horizon admits the waiter at once.
			if err := f.b.SetLimitUntil(gpu, 50, f.clock.Now().Add(time.Second)); err != nil {
				t.Fatal(err)
			}
			f.admitted(w).Release()
			a.Release()
			f.state(0, 0)
		})
	}
}
