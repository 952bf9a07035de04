package admission_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/internal/confval"
)

// lowerFull is the guarded scheduler (classes standard, then sheddable;
// learned outputs of 20 tokens) with its GPU full on the forecast of
// sheddable streams of a 1024-token cap, each stopped through the Stopper
// stop makes of its name: the pool a batch tenant keeps full. A waiter
// may start preemptively at once unless edit says otherwise.
func lowerFull(t *testing.T, edit func(*admission.Config), stop func(name string) admission.Stopper) (*fixture, []*admission.Ticket) {
	t.Helper()
	f := guarded(t, 160*16, func(c *admission.Config) {
		c.Preemption.After = confval.Duration{D: -1}
		if edit != nil {
			edit(c)
		}
	})
	return f, f.fillLower(1024, stop)
}

// fillLower fills f's GPU with sheddable streams of a maxTokens cap, as
// lowerFull does.
func (f *fixture) fillLower(maxTokens int, stop func(name string) admission.Stopper) []*admission.Ticket {
	t := f.t
	t.Helper()
	var tks []*admission.Ticket
	for i := 0; ; i++ {
		rq := chat(16, maxTokens)
		rq.Class, rq.Stopper = "sheddable", stop(fmt.Sprint("low", i))
		tk := f.tryAcquire(rq)
		if tk == nil {
			break
		}
		tks = append(tks, tk)
	}
	if len(tks) == 0 {
		t.Fatal("no sheddable stream fits")
	}
	return tks
}

func release(tks []*admission.Ticket) {
	for _, tk := range tks {
		tk.Release()
	}
}

// A request of a higher class that fits nowhere on the forecast starts at
// once on room that resumable streams of lower classes hold, where the
// guard can take that room back — and only there.
func TestPreemptionAdmitsAHigherClassOnRoomOfLowerOnes(t *testing.T) {
	resumable := func(log *stops) func(string) admission.Stopper {
		return func(n string) admission.Stopper { return resumableStopper{stopper{n, log}} }
	}
	plain := func(log *stops) func(string) admission.Stopper {
		return func(n string) admission.Stopper { return stopper{n, log} }
	}
	for _, tc := range []struct {
		name  string
		edit  func(*admission.Config)
		lower func(*stops) func(string) admission.Stopper
		class string
		max   int  // its max_tokens
		want  bool // admitted at once
	}{
		{"resumable streams below: at once", nil, resumable, "standard", 64, true},
		{"streams below that cannot be resumed: it waits", nil, plain, "standard", 64, false},
		{"off: it waits", func(c *admission.Config) { c.Preemption.Enabled = new(false) }, resumable, "standard", 64, false},
		{"the lowest class takes from nobody", nil, resumable, "sheddable", 64, false},
		// 65 blocks at worst, where 40 of the GPU's 160 are free now.
		{"its worst case does not fit beside what is held now: it waits", nil, resumable, "standard", 1024, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &stops{}
			f, low := lowerFull(t, tc.edit, tc.lower(log))
			rq := chat(16, tc.max)
			rq.Class, rq.Stopper = tc.class, resumableStopper{stopper{"hi", log}}
			tk := f.tryAcquire(rq)
			if got := tk != nil; got != tc.want {
				t.Fatalf("admitted at once: %v, want %v (stats %+v)", got, tc.want, f.b.Stats().GPUs[0])
			}
			st := f.b.Stats()
			if want := int64(0); tc.want {
				ev := f.rec.Events()
				if last := ev[len(ev)-1]; st.Preemptive != 1 || !last.Preemptive || last.Class != "standard" {
					t.Fatalf("preemptive admissions %d, the last event %v; want 1, a preemptive standard", st.Preemptive, last)
				}
				tk.Release()
			} else if st.Preemptive != want {
				t.Fatalf("preemptive admissions %d, want 0", st.Preemptive)
			}
			if got := log.names(); len(got) != 0 {
				t.Fatalf("stopped %v at admission: a preemptive start stops nobody", got)
			}
			release(low)
			f.state(0, 0)
		})
	}
}

// What preemptive requests may come to hold is never more than the guard
// can take back: their worst cases stop at what the resumable streams
// below them hold now, and each fits beside what is held now.
func TestPreemptionTakesNoMoreThanTheLowerClassesHold(t *testing.T) {
	log := &stops{}
	// Outputs of 20 or 400 tokens: the forecast holds far more than the
	// streams hold now, so that the room now is not what binds.
	f := mixed(t, 4000*16, func(c *admission.Config) {
		c.Preemption.After = confval.Duration{D: -1}
		c.Classes = []admission.ClassConfig{{Name: "standard"}, {Name: "sheddable", Sheddable: new(false)}}
	})
	// The same shape as theirs: none fits on the forecast.
	low := f.fillLower(128, func(n string) admission.Stopper { return resumableStopper{stopper{n, log}} })
	below := f.b.Stats().GPUs[0].Now
	var hi []*admission.Ticket
	var worst int64
	for {
		rq := chat(16, 128)
		rq.Stopper = resumableStopper{stopper{"hi", log}}
		tk := f.tryAcquire(rq)
		if tk == nil {
			break
		}
		hi = append(hi, tk)
		worst += tk.Weight()
	}
	if len(hi) == 0 {
		t.Fatalf("no preemptive admission beside %d held by %d streams below", below, len(low))
	}
	if worst > below || worst+hi[0].Weight() <= below {
		t.Fatalf("preemptive requests may hold %d at worst (%d each), the streams below hold %d: want the most that fits", worst, hi[0].Weight(), below)
	}
	if ps := f.b.Stats().GPUs[0]; ps.Capacity-ps.Now < hi[0].Weight() {
		t.Fatalf("the room now, %d, bound them, not what lower classes hold", ps.Capacity-ps.Now)
	}
	if st := f.b.Stats(); st.Preemptive != int64(len(hi)) || st.Queued != 0 {
		t.Fatalf("preemptive %d, queued %d; want %d, 0", st.Preemptive, st.Queued, len(hi))
	}
	release(hi)
	release(low)
	f.state(0, 0)
}

// When the batch then grows into the room a preemptive request took, the
// guard stops the lower class's streams, and never the request of the
// higher class, before what runs passes the GPU.
func TestGuardStopsTheLowerClassForAPreemptiveRequest(t *testing.T) {
	log := &stops{}
	f, low := lowerFull(t, nil, func(n string) admission.Stopper { return resumableStopper{stopper{n, log}} })
	rq := chat(16, 512)
	rq.Stopper = resumableStopper{stopper{"hi", log}}
	hi := f.tryAcquire(rq)
	if hi == nil {
		t.Fatal("not admitted preemptively")
	}
	all := append([]*admission.Ticket{hi}, low...)
	for gen := 16; gen <= 512; gen += 16 {
		for _, tk := range all {
			tk.Progress(0, gen)
			if ps := f.b.Scheduler.Stats().GPUs[0]; ps.Now-ps.Stopping > ps.Capacity {
				t.Fatalf("at %d tokens: what runs may hold %d of %d", gen, ps.Now-ps.Stopping, ps.Capacity)
			}
		}
	}
	got := log.names()
	if len(got) == 0 {
		t.Fatal("the guard stopped nothing: the batch never met the line")
	}
	for _, n := range got {
		if n == "hi" {
			t.Fatalf("stopped %v: the preemptive request of the higher class among them", got)
		}
	}
	if st := f.b.Stats(); st.Trips[admission.TripGuard] != 0 {
		t.Fatalf("guard trips %v: stops of resumable streams distrust nothing", st.Trips)
	}
	release(all)
	f.state(0, 0)
}

// A GPU whose part is a lease of a budget shared with other replicas is
// never preempted into: the lease is a hard limit.
func TestPreemptionNeverExceedsALease(t *testing.T) {
	log := &stops{}
	cfg := predicted(160*16, 100)
	cfg.Policy.MaxOvercommit, cfg.Limited = 1000, true
	cfg.Preemption.After = confval.Duration{D: -1}
	cfg.Classes = []admission.ClassConfig{{Name: "standard"}, {Name: "sheddable", Sheddable: new(false)}}
	f := newFixture(t, cfg)
	if err := f.b.SetLimit(gpu, 160*16); err != nil {
		t.Fatal(err)
	}
	f.teach(100, 20)
	low := f.fillLower(1024, func(n string) admission.Stopper { return resumableStopper{stopper{n, log}} })
	rq := chat(16, 64)
	rq.Stopper = resumableStopper{stopper{"hi", log}}
	if tk := f.tryAcquire(rq); tk != nil {
		t.Fatalf("admitted on a lease's GPU at %+v", f.b.Stats().GPUs[0])
	}
	release(low)
	f.state(0, 0)
}

// A waiter of a higher class first waits PreemptionConfig.After for room
// to free on its own, then starts preemptively at that moment: a dispatch
// pass is due then whether or not anything else happens. Room that frees
// before it is taken as any room is.
func TestPreemptionWaitsAfterFirst(t *testing.T) {
	for _, tc := range []struct {
		name       string
		freeAt     time.Duration // a lower stream finishes then; 0: none does
		preemptive int64
	}{
		{"nothing frees: preemptive at After", 0, 1},
		{"room frees first: admitted on it", 50 * time.Millisecond, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &stops{}
			const after = 200 * time.Millisecond
			f, low := lowerFull(t, func(c *admission.Config) { c.Preemption.After = confval.Duration{D: after} },
				func(n string) admission.Stopper { return resumableStopper{stopper{n, log}} })
			rq := chat(16, 64)
			rq.Stopper = resumableStopper{stopper{"hi", log}}
			ch := f.enqueue(context.Background(), rq)
			f.stillQueued(ch)
			if tc.freeAt > 0 {
				f.clock.Advance(tc.freeAt)
				low[0].Release()
				low = low[1:]
			} else {
				f.clock.Advance(after - time.Millisecond)
				f.stillQueued(ch)
				f.clock.Advance(time.Millisecond)
			}
			tk := f.admitted(ch)
			if st := f.b.Stats(); st.Preemptive != tc.preemptive {
				t.Fatalf("preemptive admissions %d, want %d", st.Preemptive, tc.preemptive)
			}
			tk.Release()
			release(low)
			f.state(0, 0)
		})
	}
}
