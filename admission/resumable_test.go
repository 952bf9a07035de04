package admission_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/kvgate/kvgate/admission"
)

// tryAcquire is a ticket when r is admitted at once, nil when it would
// queue (its Acquire is then cancelled).
func (f *fixture) tryAcquire(r admission.Request) *admission.Ticket {
	f.t.Helper()
	before := f.b.Stats().Queued
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan result, 1)
	go func() {
		tk, err := f.b.Acquire(ctx, r)
		ch <- result{tk, err}
	}()
	for {
		select {
		case res := <-ch:
			if res.err != nil {
				f.t.Fatalf("Acquire(%+v): %v", r, res.err)
			}
			return res.tk
		default:
			if f.b.Stats().Queued > before {
				cancel()
				if res := <-ch; res.err == nil {
					res.tk.Release() // granted as it was cancelled
				}
				return nil
			}
			runtime.Gosched()
		}
	}
}

// mixed is a predicted scheduler that has learned outputs of 20 and 400
// tokens, half each: a forecast with variance, so that its bound depends
// on epsilon.
func mixed(t *testing.T, capacity int64, edit func(*admission.Config)) *fixture {
	cfg := predicted(capacity, 100)
	cfg.Policy.MaxOvercommit = 1000
	if edit != nil {
		edit(&cfg)
	}
	f := newFixture(t, cfg)
	f.teach(100, 20)
	f.teach(100, 400)
	return f
}

// A stream the guard can stop and resume is admitted on the looser bound
// (ResumableEpsilon): it fills a GPU further than one it would have to cut,
// which keeps Epsilon. With ResumableEpsilon at Epsilon both are admitted
// alike.
func TestResumableStreamsAreAdmittedOnTheirOwnBound(t *testing.T) {
	admit := func(resumableEps float64, resumable bool) int {
		f := mixed(t, 4000*16, func(c *admission.Config) { c.Policy.ResumableEpsilon = resumableEps })
		log := &stops{}
		var n int
		for ; n < 1000; n++ {
			rq := chat(16, 1024)
			rq.Stopper = stopper{"r", log}
			if resumable {
				rq.Stopper = resumableStopper{stopper{"r", log}}
			}
			if f.tryAcquire(rq) == nil {
				break
			}
		}
		return n
	}
	strict, loose := admit(0, false), admit(0, true)
	if loose <= strict {
		t.Fatalf("resumable streams admitted %d, others %d: want more on the looser bound", loose, strict)
	}
	if same := admit(admission.DefaultEpsilon, true); same != strict {
		t.Fatalf("with resumable_epsilon = epsilon, resumable streams admitted %d, others %d", same, strict)
	}
	if admit(0.3, true) < loose {
		t.Fatalf("a looser resumable_epsilon admitted fewer")
	}
}

// A guard stop of streams that will be resumed is what their looser bound
// prices in: it distrusts no forecast. A stop that cuts a stream is the
// evidence that the forecast was wrong: it distrusts the queue. (The GPU
// shrinks under running requests that grow as forecast, so that the
// change detector has nothing to judge.)
func TestGuardStopOfResumableStreamsDistrustsNothing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resumable bool
		trips     int64
	}{
		{"resumable: a pause, no trip", true, 0},
		{"cut: the queue is distrusted", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := guarded(t, 160*16, nil)
			log := &stops{}
			var tks []*admission.Ticket
			for i := range 4 {
				rq := chat(16, 1024)
				name := "r" + string(rune('0'+i))
				rq.Stopper = stopper{name, log}
				if tc.resumable {
					rq.Stopper = resumableStopper{stopper{name, log}}
				}
				tks = append(tks, f.acquire(rq))
			}
			if err := f.b.Resize(8 * 16); err != nil {
				t.Fatal(err)
			}
			tks[0].Progress(0, 16)
			st := f.b.Scheduler.Stats()
			if len(log.names()) == 0 || st.Trips[admission.TripGuard] != tc.trips || st.Trips[admission.TripDrift] != 0 ||
				st.Queues[0].Distrusted != (tc.trips > 0) {
				t.Fatalf("stopped %v, trips %v, distrusted %v; want %d guard trips", log.names(), st.Trips, st.Queues[0].Distrusted, tc.trips)
			}
			for _, tk := range tks {
				tk.Release()
			}
			f.state(0, 0)
		})
	}
}

// The looser bound is validated as epsilon is.
func TestResumableEpsilonIsValidated(t *testing.T) {
	for _, eps := range []float64{-1, 0.5, 2} {
		cfg := predicted(1000, 100)
		cfg.Policy.ResumableEpsilon = eps
		if _, err := admission.New(cfg); err == nil {
			t.Errorf("resumable_epsilon %v accepted", eps)
		}
	}
}
