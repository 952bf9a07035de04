package sharedbudget_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/sharedbudget"
)

func TestLesseeGrowsByChunksAsDemandExceedsItsLease(t *testing.T) {
	r := newRig(t)
	l, p := r.lessee("a", nil)
	steps := []struct {
		held, queued int64
		want         []string
		capacity     int64
	}{
		{0, 0, []string{"store: renew -> held 0"}, 0},
		// 150 of demand: two chunks, in one round trip.
		{0, 150, []string{"store: acquire 200 least 1 -> granted 200, held 200", "pool: capacity 200"}, 200},
		{180, 0, nil, 200}, // inside the lease: no round trip
		{200, 250, []string{"store: acquire 300 least 1 -> granted 300, held 500", "pool: capacity 500"}, 500},
		// Demand past the budget asks for the budget, no more.
		{500, 5000, []string{"store: acquire 500 least 1 -> granted 500, held 1000", "pool: capacity 1000"}, 1000},
		{1000, 5000, nil, 1000},
	}
	for i, st := range steps {
		p.set(st.held, st.queued)
		l.Step(r.ctx)
		r.tr.expect(t, fmt.Sprintf("step %d (held %d, queued %d)", i, st.held, st.queued), st.want...)
		if s := l.Stats(); s.Capacity != st.capacity || s.Leased != st.capacity {
			t.Errorf("step %d: stats %+v, want capacity and lease %d", i, s, st.capacity)
		}
	}
	if s := l.Stats(); s.Grants != 3 || s.Denials != 0 || s.Renewals != 1 || s.Budget != 1000 || s.FleetLeased != 1000 {
		t.Errorf("stats %+v", s)
	}
}

func TestLesseeAsksAgainOnlyAfterRetryWhenRefused(t *testing.T) {
	r := newRig(t)
	a, pa := r.lessee("a", nil)
	b, pb := r.lessee("b", nil)
	pa.set(0, 1000)
	a.Step(r.ctx)
	pb.set(0, 100)
	b.Step(r.ctx)
	r.tr.take()
	b.Step(r.ctx) // refused a moment ago: no round trip
	r.tr.expect(t, "step inside Retry after a refusal")
	r.clock.Advance(300 * time.Millisecond)
	b.Step(r.ctx)
	r.tr.expect(t, "step after Retry", "store: acquire 100 least 1 -> granted 0, held 0")
	if s := b.Stats(); s.Denials != 2 || s.Capacity != 0 {
		t.Errorf("b: %+v, want 2 denials and no capacity", s)
	}
}

func TestLesseeReturnsWholeIdleChunksAfterTheHysteresis(t *testing.T) {
	r := newRig(t)
	l, p := r.lessee("a", nil)
	p.set(0, 450)
	l.Step(r.ctx)
	r.tr.take()
	// 80 idle: less than a chunk, kept however long.
	p.set(420, 0)
	r.drive(5*time.Second, nil, l)
	for _, line := range r.tr.take() {
		if line != "store: renew -> held 500" {
			t.Errorf("with less than a chunk idle: %q, want renewals only", line)
		}
	}
	// A dip shorter than the hysteresis costs nothing.
	p.set(120, 0)
	l.Step(r.ctx)
	r.clock.Advance(900 * time.Millisecond)
	l.Step(r.ctx)
	p.set(450, 0)
	l.Step(r.ctx)
	r.tr.expect(t, "short dip")
	// Idle for the hysteresis: the pool stops admitting into the three
	// idle chunks before they go back.
	p.set(120, 0)
	l.Step(r.ctx)
	r.clock.Advance(time.Second)
	l.Step(r.ctx)
	r.tr.expect(t, "idle for the hysteresis", "store: renew -> held 500", "pool: capacity 200", "store: release 300 -> released 300, held 200")
	if s := l.Stats(); s.Capacity != 200 || s.Leased != 200 || s.Releases != 1 || s.LostLeases != 0 {
		t.Errorf("stats %+v", s)
	}
}

// The pool admitted between the decision to give chunks back and the moment
// it applied the lower capacity: only what it does not hold goes back.
func TestLesseeGivesBackOnlyWhatThePoolDoesNotHold(t *testing.T) {
	r := newRig(t)
	l, p := r.lessee("a", nil)
	p.set(0, 500)
	l.Step(r.ctx)
	p.set(100, 0)
	l.Step(r.ctx)
	r.clock.Advance(time.Second)
	p.onCapacity = func() { p.set(350, 0) }
	r.tr.take()
	l.Step(r.ctx)
	p.onCapacity = nil
	r.tr.expect(t, "racing admission", "store: renew -> held 500", "pool: capacity 100", "store: release 150 -> released 150, held 350", "pool: capacity 350")
}

// A replica that keeps renewing keeps its lease however long it runs; the
// other replica gets only what is left.
func TestLesseeRenewsOnTheHeartbeatAndKeepsItsLease(t *testing.T) {
	r := newRig(t)
	r.store.tr = nil
	a, pa := r.lessee("a", nil)
	pa.set(0, 700)
	r.drive(30*time.Second, nil, a)
	if s := a.Stats(); s.Renewals < 29 || s.Renewals > 31 || s.Leased != 700 {
		t.Errorf("after 30s with a 3s TTL: %+v, want about 30 renewals (every TTL/3) and the lease kept", s)
	}
	b, pb := r.lessee("b", nil)
	pb.set(0, 1000)
	b.Step(r.ctx)
	if s := b.Stats(); s.Leased != 300 {
		t.Errorf("b leased %d, want the 300 that a does not hold", s.Leased)
	}
}

// deadlines records how long each renewal may take: its context's deadline
// against the real time just before and just after the step that made it.
type deadlines struct {
	sharedbudget.Store
	at []time.Time
}

func (d *deadlines) Renew(ctx context.Context, key string, r sharedbudget.Request) (sharedbudget.Lease, error) {
	if dl, ok := ctx.Deadline(); ok {
		d.at = append(d.at, dl)
	}
	return d.Store.Renew(ctx, key, r)
}

// A renewal may not carry a trusted lease past its fallback point (two
// thirds of the TTL after the last one was sent), so it gets at most what
// is left before it. A renewal sent past that point — the process was
// paused — has nothing left to protect, and gets the whole heartbeat:
// cut to nothing it could only fail, against any store not answering in
// a millisecond.
func TestLesseeRenewalTimeoutStopsAtTheFallbackPointOnlyBeforeIt(t *testing.T) {
	const ttl, hb = 3 * time.Second, time.Second
	for _, tc := range []struct {
		name  string
		quiet time.Duration // since the last renewal was sent
		want  time.Duration
	}{
		{"on the heartbeat", hb, hb},
		{"late, before the fallback point", 1500 * time.Millisecond, 500 * time.Millisecond},
		{"paused past the fallback point", 2500 * time.Millisecond, hb},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			d := &deadlines{Store: r.store}
			l, _ := r.lessee("a", func(c *sharedbudget.LesseeConfig) { c.Store, c.TTL = d, ttl })
			l.Step(r.ctx)
			r.clock.Advance(tc.quiet)
			before := time.Now()
			l.Step(r.ctx)
			after := time.Now()
			if len(d.at) != 2 {
				t.Fatalf("%d renewals, want 2", len(d.at))
			}
			if dl := d.at[1]; dl.Sub(before) < tc.want || dl.Sub(after) > tc.want {
				t.Errorf("renewal %v after the last may take %v..%v, want %v", tc.quiet, dl.Sub(after), dl.Sub(before), tc.want)
			}
			if s := l.Stats(); s.Failures != 0 || s.Renewals != 2 {
				t.Errorf("stats %+v, want two renewals and no failure", s)
			}
		})
	}
}

func TestLesseeFallsBackWithoutOvershoot(t *testing.T) {
	cases := []struct {
		name            string
		leased          int64 // before the outage
		grace           time.Duration
		inFallback      int64 // capacity from fallbackAt on
		afterGrace      int64 // capacity from failure + TTL + grace on
		afterGraceSince time.Duration
	}{
		{name: "leased above the share keeps the share", leased: 800, inFallback: 500, afterGrace: 500},
		{name: "leased below the share keeps its lease", leased: 200, inFallback: 200, afterGrace: 200},
		{name: "with a grace, grows to the share", leased: 200, grace: 10 * time.Second, inFallback: 200, afterGrace: 500, afterGraceSince: 14 * time.Second}, // first failure at 1s + TTL + grace
		{name: "nothing leased, nothing admitted", leased: 0, inFallback: 0, afterGrace: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t)
			r.store.tr = nil
			l, p := r.lessee("a", func(cfg *sharedbudget.LesseeConfig) { cfg.FallbackGrace = c.grace })
			p.set(0, c.leased)
			l.Step(r.ctx)
			p.set(c.leased, 0)
			r.store.set(r.store.s, true)
			// Renewed at 0; the heartbeat at 1s fails, retries follow
			// every 300ms; the lease is trusted until 2s (TTL − TTL/3).
			var seen []string
			last := int64(-1)
			r.drive(30*time.Second, func() {
				s := l.Stats()
				at := r.clock.Now().Sub(epoch)
				if s.Capacity != last {
					seen = append(seen, fmt.Sprintf("%v: %d", at, s.Capacity))
					last = s.Capacity
				}
				if s.Capacity > max(c.leased, 0) && (c.grace == 0 || at < c.afterGraceSince) {
					t.Fatalf("at %v capacity %d exceeds the lease %d", at, s.Capacity, c.leased)
				}
				if s.Fallback && s.Capacity > 500 {
					t.Fatalf("at %v capacity %d exceeds the static share 500", at, s.Capacity)
				}
			}, l)
			want := []string{fmt.Sprintf("0s: %d", c.leased)}
			if c.inFallback != c.leased {
				want = append(want, fmt.Sprintf("2s: %d", c.inFallback))
			}
			if c.afterGrace != c.inFallback {
				want = append(want, fmt.Sprintf("%v: %d", c.afterGraceSince, c.afterGrace))
			}
			if strings.Join(seen, ", ") != strings.Join(want, ", ") {
				t.Errorf("capacity over time: %v, want %v", seen, want)
			}
			if s := l.Stats(); !s.Fallback || s.Share != 500 || !errors.Is(s.LastError, sharedbudget.ErrUnavailable) {
				t.Errorf("stats %+v, want fallback on share 500 with the store's error", s)
			}
		})
	}
}

// The store comes back empty (a Redis restarted without persistence): the
// replica leases what its pool holds before it admits anything more, and
// grows only after a TTL, by when every replica has re-leased its own.
func TestLesseeRejoinsByLeasingWhatItHoldsFirst(t *testing.T) {
	r := newRig(t)
	l, p := r.lessee("a", nil)
	p.set(0, 800)
	l.Step(r.ctx)
	p.set(800, 0)
	r.store.set(r.store.s, true)
	r.drive(3*time.Second, nil, l) // into the fallback: capacity 500
	p.set(450, 400)                // drained some; demand is back
	r.tr.take()
	r.store.set(sharedbudget.NewMemory(r.clock.Now), false)
	back := r.clock.Now()
	r.drive(200*time.Millisecond, nil, l)
	r.tr.expect(t, "rejoin",
		"store: renew -> held 0",
		"store: acquire 450 least 450 -> granted 450, held 450",
		"pool: capacity 450")
	if s := l.Stats(); !s.Rejoining || s.Fallback || s.LostLeases != 0 {
		t.Errorf("stats %+v, want rejoining, out of fallback, no lease counted as lost", s)
	}
	// The window is a TTL from the answer (made within 200ms of the return).
	r.drive(back.Add(2900*time.Millisecond).Sub(r.clock.Now()), nil, l)
	for _, line := range r.tr.take() {
		if line != "store: renew -> held 450" {
			t.Errorf("inside the window: %q, want renewals only", line)
		}
	}
	r.drive(300*time.Millisecond, nil, l)
	r.tr.expect(t, "at the window's end", "store: renew -> held 450", "store: acquire 400 least 1 -> granted 400, held 850", "pool: capacity 850")
}

// The store held less than the replica counted while it was not failing
// (its lease expired behind its back, or Redis restarted within a TTL).
func TestLesseeNoticesALostLease(t *testing.T) {
	r := newRig(t)
	l, p := r.lessee("a", nil)
	p.set(0, 600)
	l.Step(r.ctx)
	p.set(300, 300)
	r.store.set(sharedbudget.NewMemory(r.clock.Now), false)
	r.clock.Advance(time.Second)
	r.tr.take()
	l.Step(r.ctx)
	r.tr.expect(t, "lost lease",
		"store: renew -> held 0",
		"store: acquire 300 least 300 -> granted 300, held 300",
		"pool: capacity 300")
	if s := l.Stats(); s.LostLeases != 1 || !s.Rejoining {
		t.Errorf("stats %+v, want one lost lease, rejoining", s)
	}
}

// A replica that lowers its budget under the fleet's leases: every replica
// scales its capacity to its part of the new budget at its next call.
func TestLesseeBudgetLoweredUnderTheLeasesScalesCapacity(t *testing.T) {
	r := newRig(t)
	r.store.tr = nil
	a, pa := r.lessee("a", nil)
	b, pb := r.lessee("b", nil)
	pa.set(0, 500)
	pb.set(0, 500)
	a.Step(r.ctx)
	b.Step(r.ctx)
	a.SetBudget(600)
	r.clock.Advance(time.Second)
	a.Step(r.ctx)
	b.Step(r.ctx)
	if ca, cb := a.Stats().Capacity, b.Stats().Capacity; ca != 300 || cb != 300 {
		t.Errorf("capacities %d and %d, want 300 each: 500 × 600/1000", ca, cb)
	}
}

// Three replicas under random demand, requests of bounded life, and store
// outages and restarts: the weight their pools hold together never exceeds
// the budget, and when the store is up and demand is high they fill it.
func TestLesseeFleetNeverOvershootsThroughOutagesAndRestarts(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := newRig(t)
			r.store.tr = nil
			const budget, life = 900, 4 * time.Second
			rng := rand.New(rand.NewPCG(seed, 7))
			type replica struct {
				l    *sharedbudget.Lessee
				p    *pool
				reqs []struct {
					w   int64
					end time.Time
				}
			}
			var replicas []*replica
			for i := range 3 {
				l, p := r.lessee(fmt.Sprint("r", i), func(c *sharedbudget.LesseeConfig) {
					c.Replicas, c.Budget, c.Chunk, c.FallbackGrace = 3, budget, 50, life
				})
				replicas = append(replicas, &replica{l: l, p: p})
			}
			peak := int64(0)
			for tick := range 600 { // 100ms ticks: a minute
				now := r.clock.Now()
				// Every 15s an outage: 4s and back empty (a restart), or
				// 1.5s and back with the leases that have not expired (a
				// network cut).
				switch cycle := tick / 150; {
				case tick%150 == 60:
					r.store.set(r.store.s, true)
				case tick%150 == 100 && cycle%2 == 0:
					r.store.set(sharedbudget.NewMemory(r.clock.Now), false)
				case tick%150 == 75 && cycle%2 == 1:
					r.store.set(r.store.s, false)
				}
				var sum int64
				for _, x := range replicas {
					// Requests finish within life; new ones come at random.
					kept := x.reqs[:0]
					for _, q := range x.reqs {
						if now.Before(q.end) {
							kept = append(kept, q)
						} else {
							x.p.release(q.w)
						}
					}
					x.reqs = kept
					for range rng.IntN(4) {
						w := 10 + rng.Int64N(60)
						if x.p.admit(w) {
							x.reqs = append(x.reqs, struct {
								w   int64
								end time.Time
							}{w, now.Add(time.Duration(1 + rng.Int64N(int64(life))))})
						}
					}
					// Demand stays high: there is always more queued.
					_, held := x.p.state()
					x.p.set(held, 200)
					x.l.Step(r.ctx)
					_, held = x.p.state()
					sum += held
				}
				if sum > budget {
					t.Fatalf("tick %d: the pools hold %d together, over the budget %d", tick, sum, budget)
				}
				if tick%150 < 60 && tick%150 > 40 {
					peak = max(peak, sum)
				}
				r.clock.Advance(100 * time.Millisecond)
			}
			if peak < budget*8/10 {
				t.Errorf("with the store up and demand high the pools held at most %d of %d", peak, budget)
			}
		})
	}
}

func TestLesseeShutdownGivesBackWhatThePoolDoesNotHold(t *testing.T) {
	r := newRig(t)
	l, p := r.lessee("a", nil)
	p.set(0, 700)
	l.Step(r.ctx)
	p.set(250, 450)
	r.tr.take()
	if err := l.Shutdown(r.ctx); err != nil {
		t.Fatal(err)
	}
	r.tr.expect(t, "shutdown", "pool: capacity 0", "store: release 450 -> released 450, held 250")
}

func TestLesseeConfigNamesTheBadField(t *testing.T) {
	ok := func() sharedbudget.LesseeConfig {
		return sharedbudget.LesseeConfig{Store: sharedbudget.NewMemory(nil), Key: "gpu0", Replica: "a", Replicas: 1, Chunk: 1,
			Demand: func() (int64, int64) { return 0, 0 }, OnCapacity: func(int64) {}}
	}
	cases := []struct {
		field string
		edit  func(*sharedbudget.LesseeConfig)
	}{
		{"Store", func(c *sharedbudget.LesseeConfig) { c.Store = nil }},
		{"Key", func(c *sharedbudget.LesseeConfig) { c.Key = "" }},
		{"Replica", func(c *sharedbudget.LesseeConfig) { c.Replica = "" }},
		{"Replicas", func(c *sharedbudget.LesseeConfig) { c.Replicas = 0 }},
		{"Budget", func(c *sharedbudget.LesseeConfig) { c.Budget = -1 }},
		{"Chunk", func(c *sharedbudget.LesseeConfig) { c.Chunk = 0 }},
		{"TTL", func(c *sharedbudget.LesseeConfig) { c.TTL = time.Millisecond }},
		{"Hysteresis", func(c *sharedbudget.LesseeConfig) { c.Hysteresis = -1 }},
		{"Retry", func(c *sharedbudget.LesseeConfig) { c.Retry = 2 * time.Second }},
		{"FallbackGrace", func(c *sharedbudget.LesseeConfig) { c.FallbackGrace = -1 }},
		// A lease must count at least as long as it is trusted.
		{"Residual", func(c *sharedbudget.LesseeConfig) { c.Residual = time.Second }},
		{"Demand", func(c *sharedbudget.LesseeConfig) { c.Demand = nil }},
		{"OnCapacity", func(c *sharedbudget.LesseeConfig) { c.OnCapacity = nil }},
	}
	for _, c := range cases {
		cfg := ok()
		c.edit(&cfg)
		if _, err := sharedbudget.NewLessee(cfg); err == nil || !strings.Contains(err.Error(), c.field) || !strings.Contains(err.Error(), fmt.Sprintf("%q", cfg.Key)) {
			t.Errorf("bad %s: %v, want an error naming the field and the key", c.field, err)
		}
	}
	if _, err := sharedbudget.NewLessee(ok()); err != nil {
		t.Errorf("a good config: %v", err)
	}
}
