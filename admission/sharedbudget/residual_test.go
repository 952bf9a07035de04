package sharedbudget_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/admission/sharedbudget"
)

// residualRig is two lessees, p (the one that goes silent) and b, on one
// store, stepped by hand on a manual clock. pass lets d go by for the
// lessees and for the store: on the in-process store that is the same
// clock; on Redis, whose leases run on its own clock, it also waits until
// Redis's TIME has moved d.
type residualRig struct {
	ctx    context.Context
	clock  *admissiontest.Clock
	store  sharedbudget.Store
	pass   func(d time.Duration)
	p, b   *sharedbudget.Lessee
	pp, pb *pool
}

// The TTL leaves a stalled machine two thirds of it between b's steps on
// Redis; the bound is three TTLs.
const (
	residualTTL   = 1500 * time.Millisecond
	residualBound = 3 * residualTTL
)

func newResidualRig(t *testing.T, store string) *residualRig {
	r := &residualRig{ctx: context.Background(), clock: admissiontest.NewClock(epoch)}
	switch store {
	case "memory":
		r.store, r.pass = sharedbudget.NewMemory(r.clock.Now), r.clock.Advance
	case "redis":
		h := redisHarness(t)
		r.store = h.open("kvgate:")
		r.pass = func(d time.Duration) {
			h.advance(d)
			r.clock.Advance(d)
		}
	}
	mk := func(replica string) (*sharedbudget.Lessee, *pool) {
		p := &pool{}
		l, err := sharedbudget.NewLessee(sharedbudget.LesseeConfig{
			Store: r.store, Key: "gpu0", Replica: replica, Replicas: 2, Budget: 1000, Chunk: 100,
			TTL: residualTTL, Residual: residualBound, Hysteresis: time.Second,
			Demand: p.Demand, OnCapacity: p.OnCapacity, Clock: r.clock, Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		return l, p
	}
	r.p, r.pp = mk("p")
	r.b, r.pb = mk("b")
	return r
}

// start has p lease 600 and run requests on all of it, and b, wanting the
// whole budget, lease the rest.
func (r *residualRig) start(t *testing.T) {
	t.Helper()
	r.pp.set(0, 600)
	r.p.Step(r.ctx)
	r.pp.set(600, 0)
	r.pb.set(0, 1000)
	r.b.Step(r.ctx)
	if sp, sb := r.p.Stats(), r.b.Stats(); sp.Capacity != 600 || sb.Capacity != 400 {
		t.Fatalf("before: p %+v, b %+v; want capacities 600 and 400", sp, sb)
	}
}

// silence lets d go by while p does not call (paused, cut off or dead) and b
// steps every TTL/3, as its renewals would.
func (r *residualRig) silence(d time.Duration) {
	for end := r.clock.Now().Add(d); r.clock.Now().Before(end); {
		r.pass(residualTTL / 3)
		r.b.Step(r.ctx)
	}
}

func (r *residualRig) holder(t *testing.T, replica string) sharedbudget.Holder {
	t.Helper()
	f := listing(t)(r.store.Leases(r.ctx, "gpu0"))
	for _, h := range f.Holders {
		if h.Replica == replica {
			return h
		}
	}
	return sharedbudget.Holder{Replica: replica}
}

// A replica that stops calling Redis (paused past its TTL, cut off, killed)
// may still have requests running on the GPU: its lease stays counted, as
// its residual hold, until it calls again — which revives the lease as it
// was — or until the bound has passed since its last call. What it gave
// back, or never leased, goes at once.
func TestResidualHoldKeepsASilentReplicasLeaseFromTheOthers(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			for _, tc := range []struct {
				name string
				run  func(t *testing.T, r *residualRig)
			}{
				{"silent past its TTL, then back", func(t *testing.T, r *residualRig) {
					r.silence(residualTTL + residualTTL/3)
					if st := r.b.Stats(); st.Capacity != 400 || st.Residual != 600 || st.FleetLeased != 1000 {
						t.Errorf("b while p is silent past its TTL: %+v, want capacity 400 beside p's 600 residual", st)
					}
					if h := r.holder(t, "p"); !h.Residual || h.Bytes != 600 {
						t.Errorf("p listed as %+v, want a residual hold of 600", h)
					}
					// p resumes: its first call renews the lease it had, and
					// nothing was lost.
					r.p.Step(r.ctx)
					if st := r.p.Stats(); st.Leased != 600 || st.Capacity != 600 || st.LostLeases != 0 || st.Rejoining {
						t.Errorf("p back: %+v, want its 600 leased and usable again, no lost lease", st)
					}
					if h := r.holder(t, "p"); h.Residual || h.Bytes != 600 {
						t.Errorf("p listed as %+v after its renewal, want a live lease of 600", h)
					}
					r.silence(residualTTL / 3)
					if st := r.b.Stats(); st.Residual != 0 || st.Capacity != 400 {
						t.Errorf("b after p's return: %+v, want no residual hold, capacity 400", st)
					}
				}},
				{"silent past the bound", func(t *testing.T, r *residualRig) {
					r.silence(residualBound - residualTTL/3)
					if st := r.b.Stats(); st.Capacity != 400 {
						t.Errorf("b before the bound: %+v, want capacity 400", st)
					}
					r.silence(residualTTL / 3 * 2)
					if st := r.b.Stats(); st.Capacity != 1000 || st.Residual != 0 {
						t.Errorf("b past the bound: %+v, want the whole budget", st)
					}
					r.p.Step(r.ctx)
					if st := r.p.Stats(); st.Leased != 0 || st.LostLeases != 1 {
						t.Errorf("p back past the bound: %+v, want its lease lost", st)
					}
				}},
				{"idle before it went silent", func(t *testing.T, r *residualRig) {
					// Its requests ended and it gave its chunks back after
					// the hysteresis: a silence leaves nothing behind.
					r.pp.set(0, 0)
					r.p.Step(r.ctx)
					r.pass(time.Second)
					r.p.Step(r.ctx)
					if st := r.p.Stats(); st.Leased != 0 {
						t.Fatalf("p idle past the hysteresis: %+v, want its lease given back", st)
					}
					r.silence(residualTTL / 3)
					if st := r.b.Stats(); st.Capacity != 1000 || st.Residual != 0 {
						t.Errorf("b: %+v, want the whole budget at once", st)
					}
				}},
				{"stopped cleanly", func(t *testing.T, r *residualRig) {
					// A replica that stops after its drain gives back what
					// its pool does not hold: all of it.
					r.pp.set(0, 0)
					if err := r.p.Shutdown(r.ctx); err != nil {
						t.Fatal(err)
					}
					r.silence(residualTTL / 3)
					if st := r.b.Stats(); st.Capacity != 1000 || st.Residual != 0 {
						t.Errorf("b: %+v, want the whole budget at once", st)
					}
				}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					r := newResidualRig(t, store)
					r.start(t)
					tc.run(t, r)
				})
			}
		})
	}
}

// The backend's figures end a residual hold before its bound: p's requests
// hold 600 of the GPU and b's 400. Killed, p's requests were aborted with
// its connections, and the backend reports only b's: two reports in a row
// covered by b's own holds end p's hold, and b leases the whole budget.
// Paused or cut off, p's requests run on and the backend reports them: the
// hold stays, up to its bound. One covered report alone ends nothing.
func TestResidualHoldEndsOnTheBackendsEvidence(t *testing.T) {
	const tolerance = 30 // 3% of the budget
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			for _, tc := range []struct {
				name string
				used []int64 // what the backend reports, a report per TTL/3 once p is silent past its TTL (four fit before its bound)
				// running is the requests it reports; b runs 4
				running int64
				// want b's capacity after the reports, and whether p's
				// hold went
				capacity int64
				dropped  bool
			}{
				{"killed: its requests gone", []int64{400, 410}, 4, 1000, true},
				{"killed, within the tolerance", []int64{420, 429}, 3, 1000, true},
				{"paused: its requests still run", []int64{1000, 1000, 990, 1000}, 9, 400, false},
				{"one report covered between two that are not", []int64{1000, 400, 1000, 400}, 4, 400, false},
				{"past the tolerance", []int64{431, 431, 431}, 4, 400, false},
				// b's bound is above what its requests hold; the slack can
				// hide p's memory, not p's requests.
				{"paused, its memory within b's slack, its requests counted", []int64{420, 420, 420}, 5, 400, false},
			} {
				t.Run(tc.name, func(t *testing.T) {
					r := newResidualRig(t, store)
					r.start(t)
					r.pb.set(400, 600)
					r.silence(residualTTL + residualTTL/3)
					if st := r.b.Stats(); st.Residual != 600 || st.Capacity != 400 {
						t.Fatalf("b with p silent past its TTL: %+v, want 600 residual, capacity 400", st)
					}
					var ev sharedbudget.Evidence
					for _, used := range tc.used {
						if ev.Observe(sharedbudget.Report{Used: used, Own: 400, Tolerance: tolerance, Running: tc.running, OwnRunning: 4}, r.b.Stats()) {
							r.b.DropResidual()
						}
						r.pass(residualTTL / 3)
						r.b.Step(r.ctx)
						r.b.Step(r.ctx) // the growth the drop made room for
					}
					st := r.b.Stats()
					if st.Capacity != tc.capacity || (st.ResidualDrops == 1) != tc.dropped {
						t.Errorf("b after the reports %v: %+v, want capacity %d, dropped %v", tc.used, st, tc.capacity, tc.dropped)
					}
					if h := r.holder(t, "p"); (h.Bytes == 0) != tc.dropped {
						t.Errorf("p listed as %+v, want its hold dropped: %v", h, tc.dropped)
					}
				})
			}
		})
	}
}

// A replica whose hold went on evidence and that calls again after all
// (the evidence was wrong, or it was resumed just then) finds its lease
// lost and re-leases what its pool holds before growing, as after any lost
// lease; a replica that calls again before the drop keeps its lease.
func TestResidualDropMeetsAReturningReplica(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			r := newResidualRig(t, store)
			r.start(t)
			r.silence(residualTTL + residualTTL/3)
			r.p.Step(r.ctx) // back before the drop
			r.b.DropResidual()
			r.b.Step(r.ctx)
			if st := r.b.Stats(); st.ResidualDrops != 0 || st.Capacity != 400 {
				t.Errorf("b's drop after p's return: %+v, want nothing dropped, capacity 400", st)
			}
			r.silence(residualTTL + residualTTL/3)
			r.b.DropResidual()
			r.b.Step(r.ctx)
			if st := r.b.Stats(); st.ResidualDropped != 600 {
				t.Fatalf("b's drop: %+v, want p's 600 dropped", st)
			}
			r.p.Step(r.ctx)
			if st := r.p.Stats(); st.LostLeases != 1 || !st.Rejoining {
				t.Errorf("p back after the drop: %+v, want its lease lost and a rejoin", st)
			}
		})
	}
}
