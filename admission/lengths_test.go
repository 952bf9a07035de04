package admission_test

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/predict"
)

// teachAs finishes n single-sequence requests of tenant that stopped on
// their own after length tokens.
func (f *fixture) teachAs(tenant string, n, length int) {
	f.t.Helper()
	for range n {
		r := chat(0, length+1)
		r.Tenant = tenant
		tk := f.acquire(r)
		tk.Done(0, length, false)
	}
}

func (f *fixture) delta(queue string) (admission.LengthsDelta, bool) {
	f.t.Helper()
	d, ok, err := f.b.LengthsDelta(queue)
	if err != nil {
		f.t.Fatal(err)
	}
	return d, ok
}

func samples(f *fixture) float64 { return f.b.Stats().Queues[0].Samples }

func total(counts []float64) float64 {
	var n float64
	for _, c := range counts {
		n += c
	}
	return n
}

// Two replicas exchange what they learn: each delta holds only what its
// own scheduler observed since the last one — never what it merged, never
// twice — per tenant too, so that each predicts from both.
func TestLengthsDeltaAndMerge(t *testing.T) {
	a := newFixture(t, predicted(1<<20, 20))
	b := newFixture(t, predicted(1<<20, 20))
	a.teachAs("early", 5, 100) // before sharing starts: never handed out
	if _, ok := a.delta(""); ok {
		t.Fatal("the first call handed out samples: it only starts counting")
	}
	b.delta("")

	for _, step := range []struct {
		name           string
		teachA, teachB map[string]int // tenant → sequences finished, at length 100
		// what each delta holds, all tenants and per named tenant
		wantA, wantB map[string]float64
	}{
		{name: "a learns", teachA: map[string]int{"t1": 3, "": 2},
			wantA: map[string]float64{"all": 5, "t1": 3}},
		{name: "nothing new", wantA: nil, wantB: nil},
		{name: "both learn", teachA: map[string]int{"t1": 1}, teachB: map[string]int{"t2": 4, "t1": 2},
			wantA: map[string]float64{"all": 1, "t1": 1}, wantB: map[string]float64{"all": 6, "t1": 2, "t2": 4}},
	} {
		for tenant, n := range step.teachA {
			a.teachAs(tenant, n, 100)
		}
		for tenant, n := range step.teachB {
			b.teachAs(tenant, n, 100)
		}
		beforeA, beforeB := samples(a), samples(b)
		for _, side := range []struct {
			name      string
			from, to  *fixture
			want      map[string]float64
			toSamples float64
		}{{"a", a, b, step.wantA, beforeB}, {"b", b, a, step.wantB, beforeA}} {
			d, ok := side.from.delta("")
			if ok != (side.want != nil) {
				t.Fatalf("%s: %s's delta ok=%v, want %v", step.name, side.name, ok, side.want != nil)
			}
			if !ok {
				continue
			}
			got := map[string]float64{"all": total(d.All.Ended) + total(d.All.Capped)}
			for tenant, s := range d.Tenants {
				got[tenant] = total(s.Ended) + total(s.Capped)
			}
			if len(got) != len(side.want) {
				t.Fatalf("%s: %s's delta %v, want %v", step.name, side.name, got, side.want)
			}
			for k, v := range side.want {
				if got[k] != v {
					t.Fatalf("%s: %s's delta %v, want %v", step.name, side.name, got, side.want)
				}
			}
			if err := side.to.b.MergeLengths("", d); err != nil {
				t.Fatal(err)
			}
			if s := samples(side.to); s != side.toSamples+side.want["all"] {
				t.Fatalf("%s: merging %s's delta: %v samples, want %v", step.name, side.name, s, side.toSamples+side.want["all"])
			}
		}
	}
	// a learned 5 early + 6, b 6 of its own + 6 of a's (not the early ones):
	// both predict from the fleet's, a from its early ones too.
	if sa, sb := samples(a), samples(b); sa != 17 || sb != 12 {
		t.Fatalf("samples a %v b %v, want 17 and 12", sa, sb)
	}
	// Deltas after the exchange hold nothing: what was merged is not handed on.
	if _, ok := a.delta(""); ok {
		t.Fatal("a's delta after merging holds something")
	}
	if _, ok := b.delta(""); ok {
		t.Fatal("b's delta after merging holds something")
	}
}

// A replica warming up predicts once the fleet's samples, merged, reach
// the warm-up; a waiter of a queue already predicting is admitted when a
// merge shortens its forecast.
func TestMergedLengthsDrivePredictions(t *testing.T) {
	a := newFixture(t, predicted(1<<20, 50))
	a.delta("")
	a.teachAs("", 500, 10)
	d, _ := a.delta("")

	// Warming up (10 samples needed), b holds a request at its worst case:
	// a 16-token prompt and 1024 output tokens, 65 blocks of 16 bytes.
	b := newFixture(t, predicted(1<<20, 10))
	b.delta("")
	if err := b.b.MergeLengths("", admission.LengthsDelta{All: learnedSnapshot(t, 5, 10)}); err != nil {
		t.Fatal(err)
	}
	tk := b.acquire(chat(16, 1024))
	if st, _ := b.b.GPU(gpu); st.Committed != 65*16 || b.b.Stats().Queues[0].Predicting {
		t.Fatalf("5 samples of 10 merged: committed %d (want the worst case %d), predicting %v", st.Committed, 65*16, b.b.Stats().Queues[0].Predicting)
	}
	tk.Release()
	if err := b.b.MergeLengths("", admission.LengthsDelta{All: learnedSnapshot(t, 5, 10)}); err != nil {
		t.Fatal(err)
	}
	tk = b.acquire(chat(16, 1024))
	if st, _ := b.b.GPU(gpu); st.Committed >= 65*16 || !b.b.Stats().Queues[0].Predicting {
		t.Fatalf("10 samples merged: committed %d, predicting %v; want a forecast below the worst case", st.Committed, b.b.Stats().Queues[0].Predicting)
	}
	tk.Release()

	// c predicts already, from long outputs: a second request does not fit
	// beside the first until a's short ones are merged.
	cfg := predicted(1600, 10)
	cfg.Policy.Epsilon = 0.01
	c := newFixture(t, cfg)
	c.teachAs("", 10, 1000)
	first := c.acquire(chat(16, 1024))
	w := c.enqueue(context.Background(), chat(16, 1024))
	if err := c.b.MergeLengths("", d); err != nil {
		t.Fatal(err)
	}
	c.admitted(w).Release()
	first.Release()
}

// learnedSnapshot is the snapshot of n samples of length at MaxLen 1<<17
// (the default of a queue).
func learnedSnapshot(t *testing.T, n, length int) predict.Snapshot {
	t.Helper()
	l, err := predict.NewLengths(predict.LengthsConfig{MaxLen: 1 << 17})
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		l.Observe(length, false)
	}
	return l.Snapshot()
}

func TestMergeLengthsRefusesOtherLayoutsAndUnknownQueues(t *testing.T) {
	a := newFixture(t, predicted(1<<20, 10))
	cfg := predicted(1<<20, 10)
	cfg.Queues[0].MaxLen = 4096 // another max_model_len: another layout
	b := newFixture(t, cfg)
	a.delta("")
	a.teachAs("t", 3, 100)
	d, _ := a.delta("")
	if err := b.b.MergeLengths("", d); err == nil {
		t.Fatal("a delta of another layout was merged")
	}
	if s := samples(b); s != 0 {
		t.Fatalf("a refused merge changed the predictor: %v samples", s)
	}
	if err := a.b.MergeLengths("nope", d); err == nil {
		t.Fatal("merge into an unknown queue: no error")
	}
	if _, _, err := a.b.LengthsDelta("nope"); err == nil {
		t.Fatal("delta of an unknown queue: no error")
	}
}

// A delta carries what each class learned too, so that a replica judges a
// class against the whole fleet's lengths of it.
func TestLengthsDeltaCarriesClasses(t *testing.T) {
	a := newFixture(t, predicted(1<<20, 20))
	a.delta("")
	for class, n := range map[string]int{"critical": 3, "standard": 2} {
		for range n {
			r := chat(0, 101)
			r.Class = class
			a.acquire(r).Done(0, 100, false)
		}
	}
	d, ok := a.delta("")
	if !ok || total(d.Classes["critical"].Ended) != 3 || total(d.Classes["standard"].Ended) != 2 || len(d.Classes) != 2 {
		t.Fatalf("delta classes %v (ok %v), want critical 3 and standard 2", d.Classes, ok)
	}
	b := newFixture(t, predicted(1<<20, 20))
	if err := b.b.MergeLengths("", d); err != nil {
		t.Fatal(err)
	}
	if s := samples(b); s != 5 {
		t.Fatalf("b has %v samples after the merge, want 5", s)
	}
}
