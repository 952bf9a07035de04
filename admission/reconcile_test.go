package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// A Reconciler's figure counts only once it has lasted Sustain, above the
// tolerance, less the backend's own blocks; a lower figure replaces it only
// once that has lasted too.
// Readings come once a second; the GPU is 1000 bytes, blocks 10 bytes, so
// with no request running the tolerance is 3 % of 1000 + 1 block = 40.
func TestReconcilerSustainedTransientRecovery(t *testing.T) {
	type step struct {
		used, accounted int64
		running         int
		want            int64 // Unaccounted after this reading
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "steady traffic within the tolerance shows none", steps: []step{
			{500, 480, 0, 0}, {520, 490, 1, 0}, {530, 500, 2, 0}, {560, 540, 0, 0}, {540, 500, 0, 0},
			{600, 570, 0, 0}, {600, 565, 0, 0}, {610, 570, 0, 0},
		}},
		{name: "one running request's block and the reserve widen it", steps: []step{
			// 3 running: 30 + 4 × 10 = 70 of slack.
			{570, 500, 3, 0}, {570, 500, 3, 0}, {570, 500, 3, 0}, {570, 500, 3, 0}, {570, 500, 3, 0},
			{570, 500, 3, 0}, {570, 500, 3, 0},
		}},
		{name: "a transient never counts", steps: []step{
			{100, 0, 0, 0}, {100, 0, 0, 0}, {0, 0, 0, 0}, {400, 0, 0, 0}, {400, 0, 0, 0},
			{400, 0, 0, 0}, {400, 0, 0, 0}, {0, 0, 0, 0}, {400, 0, 0, 0}, {400, 0, 0, 0},
		}},
		{name: "sustained counts after Sustain, at its lowest level, then recovers after Sustain", steps: []step{
			{0, 0, 0, 0},
			{340, 0, 0, 0}, {350, 0, 0, 0}, {360, 0, 0, 0}, {345, 0, 0, 0}, {355, 0, 0, 0},
			{340, 0, 0, 330}, // 5 s at ≥ 340: 330 past the backend's own block
			{380, 0, 0, 330}, {500, 100, 0, 330},
			{0, 0, 0, 330}, {0, 0, 0, 330}, {0, 0, 0, 330}, {0, 0, 0, 330}, {0, 0, 0, 330},
			{0, 0, 0, 0}, // 5 s at 0: recovered
		}},
		{name: "a lower level replaces a higher one once it has lasted", steps: []step{
			{640, 0, 0, 0}, {640, 0, 0, 0}, {640, 0, 0, 0}, {640, 0, 0, 0}, {640, 0, 0, 0},
			{640, 0, 0, 630},
			{240, 0, 0, 630}, {240, 0, 0, 630}, {240, 0, 0, 630}, {240, 0, 0, 630}, {240, 0, 0, 630},
			{240, 0, 0, 230},
		}},
		{name: "a dip shorter than Sustain changes nothing", steps: []step{
			{640, 0, 0, 0}, {640, 0, 0, 0}, {640, 0, 0, 0}, {640, 0, 0, 0}, {640, 0, 0, 0},
			{640, 0, 0, 630}, {0, 0, 0, 630}, {640, 0, 0, 630}, {640, 0, 0, 630}, {640, 0, 0, 630},
			{640, 0, 0, 630}, {640, 0, 0, 630}, {640, 0, 0, 630}, {0, 0, 0, 630}, {0, 0, 0, 630},
		}},
		{name: "admitted memory accounts for it", steps: []step{
			{900, 600, 0, 0}, {900, 600, 0, 0}, {900, 600, 0, 0}, {900, 600, 0, 0}, {900, 600, 0, 0},
			{900, 600, 0, 290}, {900, 900, 0, 290}, {900, 900, 0, 290}, {900, 900, 0, 290}, {900, 900, 0, 290},
			{900, 900, 0, 290}, {900, 900, 0, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := admission.NewReconciler(admission.ReconcileConfig{Tolerance: 0.03, Sustain: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			at := t0
			for i, s := range tc.steps {
				got := r.Observe(admission.Reading{At: at, Pool: 1000, Used: s.used, Accounted: s.accounted,
					Running: s.running, BlockBytes: 10})
				if got.Unaccounted != s.want {
					t.Fatalf("reading %d (%+v): Unaccounted %d, want %d (%+v)", i, s, got.Unaccounted, s.want, got)
				}
				if wantObs := max(0, s.used-s.accounted); got.Observed != wantObs {
					t.Fatalf("reading %d: Observed %d, want %d", i, got.Observed, wantObs)
				}
				at = at.Add(time.Second)
			}
		})
	}
}

// A reading that arrives out of order changes nothing, and bad settings
// are refused.
func TestReconcilerEdges(t *testing.T) {
	r, err := admission.NewReconciler(admission.ReconcileConfig{})
	if err != nil {
		t.Fatal(err)
	}
	first := r.Observe(admission.Reading{At: t0, Pool: 1000, Used: 500, BlockBytes: 10})
	if first.Tolerance != 40 { // the 3 % default + the reserved block
		t.Fatalf("default tolerance %d, want 40", first.Tolerance)
	}
	if got := r.Observe(admission.Reading{At: t0.Add(-time.Second), Pool: 1000, Used: 0}); got != first {
		t.Fatalf("an older reading changed the figures: %+v, want %+v", got, first)
	}
	for _, c := range []admission.ReconcileConfig{{Tolerance: -0.1}, {Tolerance: 1}, {Sustain: -time.Second}} {
		if _, err := admission.NewReconciler(c); err == nil {
			t.Errorf("NewReconciler(%+v): no error", c)
		}
	}
}

// Unaccounted memory comes off what a GPU admits against, beside its
// limit; lowering it admits the waiters that fit; it revokes nothing.
func TestSetUnaccountedShrinksAdmissions(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{}))
	a := f.acquire(std(40))
	if err := f.b.SetUnaccounted(gpu, 30); err != nil {
		t.Fatal(err)
	}
	if free := f.b.Scheduler.Free(gpu); free != 30 {
		t.Fatalf("Free = %d, want 30 (100 − 30 unaccounted − 40 held)", free)
	}
	w := f.enqueue(context.Background(), std(40))
	f.stillQueued(w)
	if st, _ := f.b.GPU(gpu); st.Unaccounted != 30 || st.Effective != 100 {
		t.Fatalf("stats: %+v", st)
	}
	f.setLimit(gpu, 60) // both inputs: the lower bound binds
	if free := f.b.Scheduler.Free(gpu); free != 20 {
		t.Fatalf("Free with a limit of 60 = %d, want 20", free)
	}
	f.setLimit(gpu, -1)
	if err := f.b.SetUnaccounted(gpu, 0); err != nil {
		t.Fatal(err)
	}
	b := f.admitted(w)
	if err := f.b.SetUnaccounted(gpu, 90); err != nil { // more than is free: nothing is taken back
		t.Fatal(err)
	}
	f.state(80, 0)
	a.Release()
	b.Release()
	if err := f.b.SetUnaccounted(gpu, -1); err == nil {
		t.Fatal("a negative figure: no error")
	}
	if err := f.b.SetUnaccounted("nope", 1); err == nil {
		t.Fatal("an unknown GPU: no error")
	}
}
