package admission_test

import (
	"context"
	"errors"
	"flag"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/internal/confval"
)

var soak = flag.Duration("admission.soak", 0, "run TestStress this long (e.g. 2m) instead of its short default")

// countingObserver counts what it is told, and calls back into the
// scheduler to prove it is called outside the lock (else the test
// deadlocks).
type countingObserver struct {
	s                  atomic.Pointer[admission.Scheduler]
	admitted, rejected atomic.Int64
}

func (o *countingObserver) Admitted(admission.Event) {
	o.s.Load().Stats()
	o.admitted.Add(1)
}

func (o *countingObserver) Rejected(admission.Event, string) {
	o.s.Load().Stats()
	o.rejected.Add(1)
}

// stressConfig is three GPUs, a model on all of them and one on the last,
// under the given policy, with random bounds.
func stressConfig(capacity int64, policy string, r *rand.Rand) admission.Config {
	ms := func(n int) time.Duration { return time.Duration(1+r.IntN(n)) * time.Millisecond }
	c := admission.Config{
		GPUs: []admission.GPUConfig{{Name: "a", Capacity: capacity}, {Name: "b", Capacity: capacity / 2}, {Name: "c", Capacity: capacity}},
		Queues: []admission.QueueConfig{{Name: "m", GPUs: []string{"a", "b", "c"}, MaxLen: 4096},
			{Name: "n", GPUs: []string{"c"}, MaxLen: 4096}},
		Classes: []admission.ClassConfig{
			{Name: "critical", ClassLimits: admission.ClassLimits{MaxQueued: 8 + r.IntN(16), QueueTimeout: confval.Duration{D: ms(20)}}},
			{Name: "standard", ClassLimits: admission.ClassLimits{MaxQueued: 8 + r.IntN(16), MaxQueuedBytes: confval.Size{Bytes: capacity}, QueueTimeout: confval.Duration{D: ms(10)}}},
			{Name: "sheddable", ClassLimits: admission.ClassLimits{MaxQueued: 4 + r.IntN(8), QueueTimeout: confval.Duration{D: ms(5)}}},
		},
		Tenants: []admission.TenantConfig{
			{Name: "a", Share: 0.5}, {Name: "b", Share: 0.3, QueueShare: 0.5}, {Name: "c", Share: 1},
		},
		DefaultTenantShare: 0.4,
		PressureThreshold:  0.8,
		DrainWindow:        100 * time.Millisecond,
		AIMD:               admission.AIMDConfig{Decrease: 0.7, Increase: 0.05, MinFraction: 0.3},
		Policy:             admission.PolicyConfig{Reservation: policy, WarmupSamples: 20},
		Backfill:           admission.BackfillConfig{Enabled: new(r.IntN(4) != 0), MaxHeadAge: confval.Duration{D: ms(10)}},
	}
	return c
}

// TestStress hammers a scheduler from many goroutines with random shapes,
// queues, classes, tenants, progress, finished sequences, moves,
// cancellations and deadlines, while another goroutine resizes GPUs, feeds
// the AIMD loop and the usage gate, turns GPUs off and on, and reloads the
// config — under both policies. After every change of state the
// scheduler's invariants are checked under its lock (the capacity bound at
// every admission, all the bookkeeping sums, no waiter left that could be
// admitted); at the end nothing is held or queued, and every admission was
// given back exactly once.
func TestStress(t *testing.T) {
	for _, policy := range []string{admission.WorstCase, admission.Predicted} {
		t.Run(policy, func(t *testing.T) { stress(t, policy) })
	}
}

func stress(t *testing.T, policy string) {
	dur := time.Second
	if testing.Short() {
		dur = 300 * time.Millisecond
	}
	if *soak > 0 {
		dur = *soak
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %v", seed, dur)
	rng := rand.New(rand.NewPCG(seed, 1))
	const capacity = 40000
	obs := &countingObserver{}
	cfg := stressConfig(capacity, policy, rng)
	cfg.Observer = obs
	s, err := admission.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	obs.s.Store(s)
	for _, g := range []string{"a", "c"} { // two of the three GPUs hold shared prompt blocks once
		if err := s.SetSharing(g, true); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	var firstErr error
	var admits, releases, ungrants, checks int64 // under the scheduler's lock
	admission.SetCheck(s, func(op string, err error) {
		checks++
		switch op {
		case "admit", "grant":
			admits++
		case "release":
			releases++
		case "ungrant":
			ungrants++
		}
		if err != nil {
			mu.Lock()
			if firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}
	})

	stop := time.Now().Add(dur)
	var calls, invalid, tickets, moves atomic.Int64
	var wg sync.WaitGroup
	for g := range 24 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)+2))
			tenants := []string{"a", "b", "c", "", "walk-in-1", "walk-in-2"}
			classes := []string{"critical", "standard", "sheddable", ""}
			for time.Now().Before(stop) {
				req := admission.Request{
					Queue:  []string{"m", "m", "n"}[r.IntN(3)],
					Class:  classes[r.IntN(len(classes))],
					Tenant: tenants[r.IntN(len(tenants))],
					Opaque: r.IntN(4) == 0,
				}
				for range 1 + r.IntN(2) {
					grp := admission.Group{Prompt: r.IntN(300), Cap: 1 + r.IntN(400),
						Seqs: 1 + r.IntN(2), BlockTokens: 16, BlockBytes: 16}
					if r.IntN(2) == 0 {
						// One of a few prompts' leading blocks: requests of one
						// family share them up to their shorter prompt.
						fam := uint64(1 + r.IntN(3))
						for j := range grp.Prompt / 16 {
							grp.Prefix = append(grp.Prefix, fam<<32|uint64(j))
						}
					}
					req.Shape = append(req.Shape, grp)
				}
				switch r.IntN(20) {
				case 0:
					req.Shape[0].Cap = 4000 // never fits anywhere
					req.Shape[0].Seqs = 20
				case 1:
					req.Shape, req.Weight = nil, 1+r.Int64N(200) // a plain weight
				}
				if r.IntN(3) == 0 {
					req.Deadline = time.Now().Add(time.Duration(r.IntN(20000)) * time.Microsecond)
				}
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if r.IntN(4) == 0 {
					ctx, cancel = context.WithCancel(ctx)
					time.AfterFunc(time.Duration(r.IntN(3000))*time.Microsecond, cancel)
				}
				calls.Add(1)
				var tk *admission.Ticket
				var err error
				if r.IntN(2) == 0 {
					tk, err = s.Acquire(ctx, req)
				} else {
					tk = new(admission.Ticket)
					err = s.AcquireTicket(ctx, req, tk)
				}
				if err != nil {
					cancel()
					var re *admission.RejectError
					switch {
					case errors.As(err, &re), errors.Is(err, context.Canceled):
					case strings.Contains(err.Error(), "unknown"):
						invalid.Add(1) // the chaos goroutine dropped a class or a queue for a while
					default:
						t.Errorf("Acquire(%+v): unexpected error %v", req, err)
					}
					if tk != nil && tk.Weight() != 0 {
						t.Errorf("a failed Acquire left weight %d in the ticket", tk.Weight())
					}
					time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond) // a client backing off
					continue
				}
				tickets.Add(1)
				if tk.Weight() <= 0 {
					t.Errorf("admitted ticket holds %d", tk.Weight())
				}
				// Run it: progress, finished sequences, sometimes a move.
				for gi, grp := range req.Shape {
					for gen := 0; gen < grp.Cap && r.IntN(8) != 0; gen += 1 + r.IntN(40) {
						tk.Progress(gi, gen)
					}
					if r.IntN(2) == 0 {
						tk.Done(gi, r.IntN(grp.Cap+1), r.IntN(3) == 0)
					}
				}
				if r.IntN(10) == 0 {
					moves.Add(1)
					if err := tk.Move(ctx); err != nil {
						var re *admission.RejectError
						if !errors.As(err, &re) && !errors.Is(err, context.Canceled) && !errors.Is(err, admission.ErrNotHeld) {
							t.Errorf("Move: %v", err)
						}
					}
				}
				cancel()
				if r.IntN(5) == 0 { // racing Releases: exactly one may give the weight back
					var rw sync.WaitGroup
					rw.Go(tk.Release)
					rw.Go(tk.Release)
					rw.Wait()
				} else {
					tk.Release()
				}
				tk.Release()
			}
		})
	}
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		r := rand.New(rand.NewPCG(seed, 0))
		gpus := []string{"a", "b", "c"}
		for time.Now().Before(stop) {
			p := gpus[r.IntN(3)]
			switch r.IntN(12) {
			case 0:
				if err := s.Resize(p, capacity/2+r.Int64N(capacity)); err != nil {
					t.Error(err)
				}
			case 1:
				cfg := stressConfig(capacity/2+r.Int64N(capacity), policy, r)
				if r.IntN(3) == 0 {
					cfg.Classes = cfg.Classes[:2] // drop sheddable: its waiters are refused
				}
				if r.IntN(4) == 0 {
					cfg.Queues = cfg.Queues[:1] // drop n: its waiters are refused
				}
				if err := s.Reconfigure(cfg); err != nil {
					t.Error(err)
				}
			case 2, 3:
				_ = s.SetAvailable([]string{"m", "n"}[r.IntN(2)], p, r.IntN(3) != 0)
			case 4:
				if err := s.SetUsage(p, r.Int64N(capacity), r.IntN(2) == 0); err != nil {
					t.Error(err)
				}
			default:
				if err := s.Feedback(p, r.IntN(3) == 0); err != nil {
					t.Error(err)
				}
			}
			time.Sleep(time.Duration(r.IntN(500)) * time.Microsecond)
		}
		// Everything available again, so that nothing waits for a GPU
		// that stays off.
		for _, q := range []string{"m", "n"} {
			for _, p := range gpus {
				_ = s.SetAvailable(q, p, true)
			}
		}
	}()
	wg.Wait()
	<-chaosDone

	if firstErr != nil {
		t.Fatalf("invariant broken: %v", firstErr)
	}
	st := s.Stats()
	if st.Queued != 0 {
		t.Fatalf("left queued: %d", st.Queued)
	}
	for _, p := range st.GPUs {
		if p.Held != 0 || p.Charge != 0 || p.Tickets != 0 || p.Committed != 0 {
			t.Fatalf("GPU left behind: %+v", p)
		}
	}
	for _, q := range st.Queues {
		for _, c := range q.Classes {
			if c.Held != 0 || c.Queued != 0 {
				t.Fatalf("class of %q left behind: %+v", q.Name, c)
			}
		}
	}
	for _, ten := range st.Tenants {
		if ten.Held != 0 || ten.Queued != 0 {
			t.Fatalf("tenant left behind: %+v", ten)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// A ticket that finished every sequence gave everything back without a
	// "release" op; a moved one was granted twice. So: every grant is
	// matched by at most one release or ungrant, none is missing at the end
	// (nothing is held), and every exit is counted once.
	if admits < releases+ungrants || admits-ungrants < tickets.Load() {
		t.Fatalf("admitted %d, released %d, grants given back %d, tickets handed out %d",
			admits, releases, ungrants, tickets.Load())
	}
	var rejected int64
	for _, n := range st.Rejected {
		rejected += n
	}
	if obs.admitted.Load() != st.Admitted || obs.rejected.Load() != rejected+st.Canceled ||
		st.Admitted+rejected+st.Canceled+invalid.Load() < calls.Load() {
		t.Fatalf("exits miscounted: %d calls, %d moves; stats %+v; observer %d admitted, %d rejected",
			calls.Load(), moves.Load(), st, obs.admitted.Load(), obs.rejected.Load())
	}
	t.Logf("%d calls: %d admitted (%d after waiting, %d backfilled, %d moves), rejected %v, %d canceled; %d checks",
		calls.Load(), st.Admitted, st.AdmittedAfterWait, st.Backfilled, moves.Load(), st.Rejected, st.Canceled, checks)
}
