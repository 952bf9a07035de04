package sharedbudget

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
)

// fakeSched is the scheduler as the fleet sees it: demands the test sets,
// and the limits the fleet sets, recorded.
type fakeSched struct {
	mu     sync.Mutex
	demand map[string][2]int64 // pool -> held, queued
	limits map[string]int64    // pool -> the last limit set
	head   map[string]fakeHead // pool -> its longest-waiting request
	// tenants is what the test says each pool's tenants hold; elsewhere
	// what the fleet set the others hold for them.
	tenants, elsewhere map[string]map[string]admission.TenantLoad
	changed            chan struct{} // a limit was set (non-blocking, capacity 1)
}

var _ Scheduler = (*fakeSched)(nil)

func newFakeSched() *fakeSched {
	return &fakeSched{demand: map[string][2]int64{}, limits: map[string]int64{}, head: map[string]fakeHead{},
		tenants: map[string]map[string]admission.TenantLoad{}, elsewhere: map[string]map[string]admission.TenantLoad{}, changed: make(chan struct{}, 1)}
}

func (s *fakeSched) setDemand(pool string, held, queued int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.demand[pool] = [2]int64{held, queued}
}

func (s *fakeSched) Demand(pool string) (int64, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.demand[pool]
	return d[0], d[1]
}

func (s *fakeSched) Head(pool string) (int64, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.head[pool]
	return h.charge, h.waited
}

// setHead makes pool's longest-waiting request one of charge, waiting for
// waited (0, 0: none).
func (s *fakeSched) setHead(pool string, charge int64, waited time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.head[pool] = fakeHead{charge, waited}
}

func (s *fakeSched) TenantHolds(pool string) map[string]admission.TenantLoad {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tenants[pool]
}

func (s *fakeSched) SetTenantsElsewhere(pool string, others map[string]admission.TenantLoad) error {
	s.mu.Lock()
	s.elsewhere[pool] = others
	s.mu.Unlock()
	return nil
}

type fakeHead struct {
	charge int64
	waited time.Duration
}

// Holding is the held demand, one request: the tests' requests hold what
// they reserved.
func (s *fakeSched) Holding(pool string) (int64, int) {
	held, _ := s.Demand(pool)
	return held, 1
}

func (s *fakeSched) SetLimitUntil(pool string, limit int64, _ time.Time) error {
	s.mu.Lock()
	s.limits[pool] = limit
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

func (s *fakeSched) SetMargin(string, float64) error { return nil }

func (s *fakeSched) LengthsDelta(string) (admission.LengthsDelta, bool, error) {
	return admission.LengthsDelta{}, false, nil
}

func (s *fakeSched) MergeLengths(string, admission.LengthsDelta) error { return nil }

// waitLimit waits until pool's limit is want. The lessee sets it from its
// own goroutine after a round trip to a real Redis.
func (s *fakeSched) waitLimit(t *testing.T, pool string, want int64) {
	t.Helper()
	guard := time.After(30 * time.Second) // against hanging, not a measurement
	for {
		s.mu.Lock()
		got := s.limits[pool]
		s.mu.Unlock()
		if got == want {
			return
		}
		select {
		case <-s.changed:
		case <-guard:
			t.Fatalf("pool %s: limit %d, want %d", pool, got, want)
		}
	}
}

// The door, stepped: Start leases for the GPUs it is given; Sync keeps the
// lessee of a GPU that stays, holds the lease of one removed while its
// requests run (taking it back if it returns) and gives it back once they
// end; Close gives back the rest.
func TestSyncKeepsDrainsAndGivesBack(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	cfg, err := parse(t, "{redis: '"+srv.URL()+"', replicas: 2, replica: a, chunk: '10%'}")
	if err != nil {
		t.Fatal(err)
	}
	clock := admissiontest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	f := New(cfg, Deps{Clock: clock, Logger: slog.New(slog.DiscardHandler)})
	closed := false
	t.Cleanup(func() {
		if !closed {
			f.Close()
		}
	})
	sched := newFakeSched()
	sched.setDemand("p0", 0, 150)
	gpu0 := GPU{Name: "gpu0", ID: "p0", Nominal: 1000, Budget: 1000}
	if err := f.Start(sched, func() []string { return nil }, []GPU{gpu0}); err != nil {
		t.Fatal(err)
	}
	sched.waitLimit(t, "p0", 200) // two chunks of 10%
	// A store of the test's own: it outlives the fleet's client.
	store := NewRedis(srv.Client(), RedisOptions{Prefix: cfg.KeyPrefix})
	leased := func(gpu string) int64 {
		t.Helper()
		l, err := store.Leases(context.Background(), gpu)
		if err != nil {
			t.Fatal(err)
		}
		return l.Total
	}
	lessee := func() *poolLease {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.lessees["p0"]
	}
	pl := lessee()
	if ls := f.Leases(); len(ls) != 1 || ls[0].GPU != "gpu0" || ls[0].ID != "p0" || ls[0].Stats.Leased != 200 {
		t.Fatalf("Leases: %+v", ls)
	}

	smaller := gpu0
	smaller.Budget = 800
	if err := f.Sync([]GPU{smaller}); err != nil {
		t.Fatal(err)
	}
	if lessee() != pl || pl.budget.Load() != 800 {
		t.Fatal("a GPU that stays got a new lessee, or its budget was not passed on")
	}

	sched.setDemand("p0", 200, 0) // its requests run
	for range 2 {                 // removed, back, removed again
		if err := f.Sync(nil); err != nil {
			t.Fatal(err)
		}
		if len(f.Leases()) != 0 || leased("gpu0") != 200 {
			t.Fatalf("removed while its requests run: lessees %+v, %d leased; want none listed and the lease kept", f.Leases(), leased("gpu0"))
		}
		if err := f.Sync([]GPU{smaller}); err != nil {
			t.Fatal(err)
		}
		if lessee() != pl {
			t.Fatal("a GPU back before its requests ended got a new lessee")
		}
		if err := f.Sync(nil); err != nil {
			t.Fatal(err)
		}
	}
	f.reapDrained()
	if leased("gpu0") != 200 {
		t.Fatal("the lease went back while the removed GPU's requests run")
	}
	sched.setDemand("p0", 0, 0)
	f.reapDrained()
	if n := leased("gpu0"); n != 0 {
		t.Fatalf("%d still leased once the removed GPU's requests ended", n)
	}

	sched.setDemand("p1", 0, 50)
	if err := f.Sync([]GPU{{Name: "gpu1", ID: "p1", Nominal: 1000, Budget: 1000}}); err != nil {
		t.Fatal(err)
	}
	sched.waitLimit(t, "p1", 100)
	f.Close()
	closed = true
	if n := leased("gpu1"); n != 0 {
		t.Fatalf("%d still leased after Close", n)
	}
}

// A silent replica's residual hold is nobody's to share: the live
// replicas' fair level is of the budget less it. Here p leased 600 and went
// silent, b and c each want the whole budget of 1000: they share the 400
// left, 200 each, not 1000 (which would leave b leasing all 400 and c
// nothing).
func TestFairLevelLeavesResidualHoldsOut(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	cfg, err := parse(t, "{redis: '"+srv.URL()+"', replicas: 3, replica: b, chunk: '10%'}")
	if err != nil {
		t.Fatal(err)
	}
	ctx, c := context.Background(), srv.Client()
	store := NewRedis(c, RedisOptions{Prefix: cfg.KeyPrefix})
	silent := Request{Replica: "p", Budget: 1000, TTL: 100 * time.Millisecond, Residual: time.Hour}
	if _, err := store.Acquire(ctx, "gpu0", silent, 600, 0); err != nil {
		t.Fatal(err)
	}
	// Leases run on Redis's clock: wait until p's TTL has passed there.
	start, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for {
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if left := silent.TTL - now.Sub(start); left > 0 {
			<-time.After(left)
			continue
		}
		break
	}
	if err := fairScript.Run(ctx, c, []string{cfg.KeyPrefix + "{gpu0}:demand"}, "c", 1000, time.Minute.Milliseconds()).Err(); err != nil {
		t.Fatal(err)
	}

	clock := admissiontest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	f := New(cfg, Deps{Clock: clock, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(f.Close)
	sched := newFakeSched()
	sched.setDemand("p0", 0, 1000)
	if err := f.Start(sched, func() []string { return nil }, []GPU{{Name: "gpu0", ID: "p0", Nominal: 1000, Budget: 1000}}); err != nil {
		t.Fatal(err)
	}
	sched.waitLimit(t, "p0", 400) // all that p's residual hold leaves
	f.mu.Lock()
	pl := f.lessees["p0"]
	f.mu.Unlock()
	if st := pl.l.Stats(); st.Residual != 600 {
		t.Fatalf("b's lessee: %+v, want p's 600 seen as a residual hold", st)
	}
	f.fairStep(ctx, pl)
	if lv := pl.level.Load(); lv != 200 {
		t.Errorf("fair level %d, want 200: half of the 400 the residual hold leaves", lv)
	}
	sched.waitLimit(t, "p0", 200)
}

// A request larger than a replica's fair level gets a turn: three replicas
// saturate a GPU of 1000 (fair level 333, 400 in chunks of 100), and a's
// head needs 400 on top of the 100 it holds. Its replica's level becomes
// 500 and the others hold back to 200 each, so that what they give back
// as their requests end is a's to lease; once the head is admitted the
// levels are fair again.
func TestABigRequestGetsATurn(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	clock := admissiontest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	start := func(name string, held, queued int64) replica {
		return startReplica(t, srv.URL(), clock, name, func(s *fakeSched) { s.setDemand("p0", held, queued) })
	}
	a, b, c := start("a", 100, 400), start("b", 330, 700), start("c", 330, 700)
	a.sched.setHead("p0", 400, 10*time.Second)
	b.sched.setHead("p0", 10, time.Second)
	all := []replica{a, b, c}
	step := func() {
		for range 2 { // every replica posts, then every one reads the whole board
			for _, r := range all {
				r.f.fairStep(ctx, r.pl)
			}
		}
	}
	levels := func(what string, want ...int64) {
		t.Helper()
		for i, r := range all {
			if got := r.pl.level.Load(); got != want[i] {
				t.Errorf("%s: %s's level %d, want %d", what, r.f.cfg.Replica, got, want[i])
			}
			r.sched.waitLimit(t, "p0", min(r.pl.l.Stats().Capacity, want[i]))
		}
	}
	step()
	levels("a's big head waiting", 500, 200, 200)
	if a.pl.turn != "a" || b.pl.turn != "a" {
		t.Errorf("turn as a and b read it: %q, %q; want a", a.pl.turn, b.pl.turn)
	}

	// Admitted: a holds it, and its next head is small.
	a.sched.setDemand("p0", 500, 100)
	a.sched.setHead("p0", 20, time.Second)
	step()
	levels("a's big request admitted", 400, 400, 400)
	if a.pl.turn != "" {
		t.Errorf("turn %q after the big request was admitted, want none", a.pl.turn)
	}
}

// A tenant's share holds across the fleet: each replica posts what its
// capped tenants hold and want on a GPU, and hands the sum of what the
// others posted to its scheduler. A post of holds alone (a number, as a
// replica without demand posts) counts its holds as its demand.
func TestTenantHoldsAreSharedAcrossReplicas(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	clock := admissiontest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	start := func(name string, tenants map[string]admission.TenantLoad) replica {
		return startReplica(t, srv.URL(), clock, name, func(s *fakeSched) { s.tenants["p0"] = tenants })
	}
	a := start("a", map[string]admission.TenantLoad{"t1": {Held: 100, Demand: 150}, "t2": {Held: 50, Demand: 50}})
	b := start("b", map[string]admission.TenantLoad{"t1": {Held: 200, Demand: 400}})
	c := start("c", nil)
	for _, r := range []replica{a, b, c, a} {
		r.f.fairStep(ctx, r.pl)
	}
	// A replica of the earlier format posts holds alone.
	if err := redis.NewClient(&redis.Options{Addr: srv.Addr()}).HSet(ctx, a.f.tenantKey(a.pl.gpu), "old",
		fmt.Sprintf("%d %s", time.Now().Add(time.Hour).UnixMilli(), `{"t1":10}`)).Err(); err != nil {
		t.Fatal(err)
	}
	c.f.fairStep(ctx, c.pl)
	sa, sb, sc := a.sched, b.sched, c.sched
	for _, c := range []struct {
		name string
		s    *fakeSched
		want map[string]admission.TenantLoad
	}{
		{"a", sa, map[string]admission.TenantLoad{"t1": {Held: 200, Demand: 400}}},
		{"b", sb, map[string]admission.TenantLoad{"t1": {Held: 100, Demand: 150}, "t2": {Held: 50, Demand: 50}}},
		{"c", sc, map[string]admission.TenantLoad{"t1": {Held: 310, Demand: 560}, "t2": {Held: 50, Demand: 50}}},
	} {
		c.s.mu.Lock()
		got := c.s.elsewhere["p0"]
		c.s.mu.Unlock()
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: elsewhere %v, want %v", c.name, got, c.want)
		}
	}
}

// A replica that shuts down takes its tenants' holds off the board with its
// demand: the others stop counting them at their next step, not a TTL later.
func TestTenantHoldsLeaveWithTheReplica(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	clock := admissiontest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	a := startReplica(t, srv.URL(), clock, "a", func(s *fakeSched) { s.tenants["p0"] = map[string]admission.TenantLoad{"t1": {Held: 100, Demand: 100}} })
	b := startReplica(t, srv.URL(), clock, "b", func(s *fakeSched) { s.tenants["p0"] = map[string]admission.TenantLoad{"t1": {Held: 200, Demand: 200}} })
	for _, r := range []replica{a, b, a} {
		r.f.fairStep(ctx, r.pl)
	}
	elsewhere := func() map[string]admission.TenantLoad {
		a.sched.mu.Lock()
		defer a.sched.mu.Unlock()
		return a.sched.elsewhere["p0"]
	}
	if got := elsewhere(); got["t1"].Held != 200 {
		t.Fatalf("a counts %v elsewhere, want t1 200 (b's)", got)
	}
	b.f.Close()
	a.f.fairStep(ctx, a.pl)
	if got := elsewhere(); len(got) != 0 {
		t.Errorf("a counts %v elsewhere after b shut down, want nothing", got)
	}
}

// replica is one Replica on a fake scheduler, with its lessee of pool p0.
type replica struct {
	f     *Replica
	sched *fakeSched
	pl    *poolLease
}

// startReplica starts replica name of three on the Redis at url, leasing
// GPU gpu0 (pool p0, budget 1000, chunks of 10%) on clock; set prepares
// its scheduler first.
func startReplica(t *testing.T, url string, clock admission.Clock, name string, set func(*fakeSched)) replica {
	t.Helper()
	cfg, err := parse(t, "{redis: '"+url+"', replicas: 3, replica: "+name+", chunk: '10%'}")
	if err != nil {
		t.Fatal(err)
	}
	f := New(cfg, Deps{Clock: clock, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(f.Close)
	sched := newFakeSched()
	set(sched)
	if err := f.Start(sched, func() []string { return nil }, []GPU{{Name: "gpu0", ID: "p0", Nominal: 1000, Budget: 1000}}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return replica{f, sched, f.lessees["p0"]}
}
