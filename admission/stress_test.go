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
)

var soak = flag.Duration("admission.soak", 0, "run TestStress this long (e.g. 2m) instead of its short default")

// countingObserver counts what it is told, and calls back into the budget
// to prove it is called outside the lock (else the test deadlocks).
type countingObserver struct {
	b                  atomic.Pointer[admission.Budget]
	admitted, rejected atomic.Int64
}

func (o *countingObserver) Admitted(class, tenant string, w int64, waited time.Duration) {
	o.b.Load().Free()
	o.admitted.Add(1)
}

func (o *countingObserver) Rejected(class, tenant, reason string, w int64, waited time.Duration) {
	o.b.Load().Free()
	o.rejected.Add(1)
}

func stressConfig(capacity int64, r *rand.Rand) admission.Config {
	ms := func(n int) time.Duration { return time.Duration(1+r.IntN(n)) * time.Millisecond }
	return admission.Config{
		Capacity: capacity,
		Classes: []admission.ClassConfig{
			{Name: "critical", MaxQueued: 8 + r.IntN(16), QueueTimeout: ms(20)},
			{Name: "standard", MaxQueued: 8 + r.IntN(16), MaxQueuedBytes: capacity, QueueTimeout: ms(10)},
			{Name: "sheddable", MaxQueued: 4 + r.IntN(8), QueueTimeout: ms(5), Sheddable: true},
		},
		Tenants: []admission.TenantConfig{
			{Name: "a", Share: 0.5}, {Name: "b", Share: 0.3, QueueShare: 0.5}, {Name: "c", Share: 1},
		},
		DefaultTenantShare: 0.4,
		PressureThreshold:  0.8,
		DrainWindow:        100 * time.Millisecond,
		AIMD:               admission.AIMDConfig{Decrease: 0.7, Increase: 0.05, MinFraction: 0.3},
	}
}

// TestStress hammers one budget from many goroutines with random weights,
// classes, tenants, cancellations and deadlines, while another goroutine
// resizes it, feeds the AIMD loop and reloads its config. After every change
// of state the budget's invariants are checked under its lock (held <=
// effective at every admission, all the bookkeeping sums, no waiter left
// that could be admitted); at the end nothing is held or queued, and every
// admission was given back exactly once.
func TestStress(t *testing.T) {
	dur := 2 * time.Second
	if testing.Short() {
		dur = 300 * time.Millisecond
	}
	if *soak > 0 {
		dur = *soak
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %v", seed, dur)
	rng := rand.New(rand.NewPCG(seed, 1))
	const capacity = 1000
	obs := &countingObserver{}
	cfg := stressConfig(capacity, rng)
	cfg.Observer = obs
	b, err := admission.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	obs.b.Store(b)

	var mu sync.Mutex
	var firstErr error
	var admits, releases, ungrants, checks int64 // under the budget's lock
	admission.SetCheck(b, func(op string, err error) {
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
	var calls, invalid, tickets, doubleReleases atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)+2))
			tenants := []string{"a", "b", "c", "", "walk-in-1", "walk-in-2"}
			classes := []string{"critical", "standard", "sheddable", ""}
			for time.Now().Before(stop) {
				req := admission.Request{
					Weight: 1 + r.Int64N(150),
					Class:  classes[r.IntN(len(classes))],
					Tenant: tenants[r.IntN(len(tenants))],
				}
				switch r.IntN(20) {
				case 0:
					req.Weight = capacity + 1 + r.Int64N(500) // never fits
				case 1:
					req.Weight = 1
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
					tk, err = b.Acquire(ctx, req)
				} else {
					tk = new(admission.Ticket)
					err = b.AcquireTicket(ctx, req, tk)
				}
				cancel()
				if err != nil {
					var re *admission.RejectError
					switch {
					case errors.As(err, &re), errors.Is(err, context.Canceled):
					case req.Class == "sheddable" && strings.Contains(err.Error(), "unknown"):
						invalid.Add(1) // the chaos goroutine dropped the class for a while
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
				if tk.Weight() != req.Weight {
					t.Errorf("ticket weight %d, want %d", tk.Weight(), req.Weight)
				}
				if r.IntN(2) == 0 {
					time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
				}
				if r.IntN(3) == 0 {
					tk.Shrink(r.Int64N(req.Weight + 1))
				}
				if r.IntN(5) == 0 { // racing Releases: exactly one may give the weight back
					doubleReleases.Add(1)
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
		for time.Now().Before(stop) {
			switch r.IntN(10) {
			case 0:
				if err := b.Resize(capacity/2 + r.Int64N(capacity)); err != nil {
					t.Error(err)
				}
			case 1:
				cfg := stressConfig(capacity/2+r.Int64N(capacity), r)
				if r.IntN(3) == 0 {
					cfg.Classes = cfg.Classes[:2] // drop sheddable: its waiters are refused
				}
				if err := b.Reconfigure(cfg); err != nil {
					t.Error(err)
				}
			default:
				b.Feedback(r.IntN(3) == 0)
			}
			time.Sleep(time.Duration(r.IntN(500)) * time.Microsecond)
		}
	}()
	wg.Wait()
	<-chaosDone

	if firstErr != nil {
		t.Fatalf("invariant broken: %v", firstErr)
	}
	s := b.Stats()
	if s.Held != 0 || s.Queued != 0 || s.QueuedBytes != 0 {
		t.Fatalf("left behind: held %d, queued %d (%d bytes)", s.Held, s.Queued, s.QueuedBytes)
	}
	for _, c := range s.Classes {
		if c.Held != 0 || c.Queued != 0 {
			t.Fatalf("class left behind: %+v", c)
		}
	}
	for _, ten := range s.Tenants {
		if ten.Held != 0 || ten.Queued != 0 {
			t.Fatalf("tenant left behind: %+v", ten)
		}
	}
	b.Feedback(false) // one more check of the settled state
	mu.Lock()
	defer mu.Unlock()
	if admits != releases+ungrants || admits-ungrants != tickets.Load() {
		t.Fatalf("admitted %d, released %d, grants given back %d, tickets handed out %d",
			admits, releases, ungrants, tickets.Load())
	}
	var rejected int64
	for _, n := range s.Rejected {
		rejected += n
	}
	if s.Admitted != tickets.Load() || s.Admitted+rejected+s.Canceled+invalid.Load() != calls.Load() ||
		obs.admitted.Load() != s.Admitted || obs.rejected.Load() != rejected+s.Canceled {
		t.Fatalf("exits miscounted: %d calls; stats %+v; observer %d admitted, %d rejected",
			calls.Load(), s, obs.admitted.Load(), obs.rejected.Load())
	}
	t.Logf("%d calls: %d admitted (%d after waiting, %d double releases), rejected %v, %d canceled; %d checks",
		calls.Load(), s.Admitted, s.AdmittedAfterWait, doubleReleases.Load(), s.Rejected, s.Canceled, checks)
}
