package sharedbudget_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/admission/sharedbudget"
	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
)

// harness is one Store implementation as the contract sees it.
type harness struct {
	// open returns a store on the shared backend whose keys live under
	// prefix.
	open func(prefix string) sharedbudget.Store
	// advance lets at least d pass on the store's clock.
	advance func(d time.Duration)
}

func memoryHarness(t *testing.T) harness {
	clock := admissiontest.NewClock(time.Unix(1_000_000, 0))
	m := sharedbudget.NewMemory(clock.Now)
	return harness{
		open:    func(prefix string) sharedbudget.Store { return m.Prefixed(prefix) },
		advance: clock.Advance,
	}
}

// redisHarness runs the contract on a real redis-server. Its clock cannot be
// moved, so advance waits until Redis's own TIME has moved on.
func redisHarness(t *testing.T) harness {
	srv := sharedbudgettest.StartRedis(t)
	c := srv.Client()
	return harness{
		open: func(prefix string) sharedbudget.Store {
			return sharedbudget.NewRedis(c, sharedbudget.RedisOptions{Prefix: prefix})
		},
		advance: func(d time.Duration) {
			ctx := context.Background()
			start, err := c.Time(ctx).Result()
			if err != nil {
				t.Fatalf("redis TIME: %v", err)
			}
			for {
				now, err := c.Time(ctx).Result()
				if err != nil {
					t.Fatalf("redis TIME: %v", err)
				}
				left := d - now.Sub(start)
				if left <= 0 {
					return
				}
				<-time.After(left)
			}
		},
	}
}

// TestStoreContract runs every contract point against both stores: the
// in-process reference and Redis.
func TestStoreContract(t *testing.T) {
	impls := []struct {
		name string
		h    func(*testing.T) harness
	}{
		{"memory", memoryHarness},
		{"redis", redisHarness},
	}
	points := []struct {
		name string
		run  func(*testing.T, harness)
	}{
		{"GrantNeverExceedsBudget", contractGrantNeverExceedsBudget},
		{"ReleaseReturnsExactlyWhatWasGranted", contractReleaseReturnsExactlyWhatWasGranted},
		{"ConcurrentReplicasNeverExceedBudget", contractConcurrentReplicasNeverExceedBudget},
		{"LostLeaseComesBackAfterTTL", contractLostLeaseComesBackAfterTTL},
		{"ResidualHoldCountsUntilItsBound", contractResidualHoldCountsUntilItsBound},
		{"DropResidualEndsOnlyResidualHolds", contractDropResidualEndsOnlyResidualHolds},
		{"SmallestBudgetWins", contractSmallestBudgetWins},
		{"RaisedBudgetWaitsForTheLastAnnouncement", contractRaisedBudgetWaitsForTheLastAnnouncement},
		{"PrefixAndKeyIsolateBudgets", contractPrefixAndKeyIsolateBudgets},
		{"ErrorsNameTheKey", contractErrorsNameTheKey},
		{"FleetListsEveryReplica", contractFleetListsEveryReplica},
		{"LargeSizesAreExact", contractLargeSizesAreExact},
	}
	for _, impl := range impls {
		t.Run(impl.name, func(t *testing.T) {
			h := impl.h(t)
			for i, p := range points {
				t.Run(p.name, func(t *testing.T) {
					// Each point gets its own prefix, so points never see
					// each other's leases on the shared backend.
					p.run(t, harness{
						open:    func(prefix string) sharedbudget.Store { return h.open(fmt.Sprintf("t%d:%s", i, prefix)) },
						advance: h.advance,
					})
				})
			}
		})
	}
}

const long = time.Minute // a TTL no test outlives

func req(replica string, budget int64) sharedbudget.Request {
	return sharedbudget.Request{Replica: replica, Budget: budget, TTL: long}
}

// lease and listing fail the test on an error and pass the value on:
// lease(t)(s.Acquire(...)).
func lease(t *testing.T) func(sharedbudget.Lease, error) sharedbudget.Lease {
	return func(l sharedbudget.Lease, err error) sharedbudget.Lease {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
}

func listing(t *testing.T) func(sharedbudget.Listing, error) sharedbudget.Listing {
	return func(f sharedbudget.Listing, err error) sharedbudget.Listing {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
}

func contractGrantNeverExceedsBudget(t *testing.T, h harness) {
	s, ctx := h.open(""), context.Background()
	steps := []struct {
		replica      string
		bytes, min   int64
		granted      int64
		held, total  int64
		releaseFirst int64 // release this much of replica's lease before acquiring
	}{
		{replica: "a", bytes: 60, granted: 60, held: 60, total: 60},
		{replica: "b", bytes: 60, granted: 0, held: 0, total: 60},             // all or nothing
		{replica: "b", bytes: 60, min: 10, granted: 40, held: 40, total: 100}, // what is free
		{replica: "c", bytes: 1, min: 1, granted: 0, held: 0, total: 100},
		{replica: "a", releaseFirst: 30, bytes: 31, granted: 0, held: 30, total: 70},
		{replica: "c", bytes: 30, granted: 30, held: 30, total: 100},
		{replica: "a", bytes: 100, min: 1, granted: 0, held: 30, total: 100},
	}
	for i, st := range steps {
		if st.releaseFirst > 0 {
			lease(t)(s.Release(ctx, "gpu0", req(st.replica, 100), st.releaseFirst))
		}
		l := lease(t)(s.Acquire(ctx, "gpu0", req(st.replica, 100), st.bytes, st.min))
		if l.Granted != st.granted || l.Held != st.held || l.Total != st.total || l.Budget != 100 {
			t.Errorf("step %d (%s acquires %d, min %d): got granted %d held %d total %d budget %d, want %d %d %d 100",
				i, st.replica, st.bytes, st.min, l.Granted, l.Held, l.Total, l.Budget, st.granted, st.held, st.total)
		}
	}
}

func contractReleaseReturnsExactlyWhatWasGranted(t *testing.T, h harness) {
	s, ctx := h.open(""), context.Background()
	a, b := req("a", 100), req("b", 100)
	lease(t)(s.Acquire(ctx, "gpu0", b, 20, 0))
	g := lease(t)(s.Acquire(ctx, "gpu0", a, 70, 1))
	if g.Granted != 70 {
		t.Fatalf("granted %d, want 70", g.Granted)
	}
	for _, st := range []struct {
		bytes, released, held, total int64
	}{
		{25, 25, 45, 65},
		{45, 45, 0, 20},
		{10, 0, 0, 20}, // nothing left to return: the count never goes negative
	} {
		l := lease(t)(s.Release(ctx, "gpu0", a, st.bytes))
		if l.Released != st.released || l.Held != st.held || l.Total != st.total || (l.Held == 0) != (l.TTL == 0) {
			t.Errorf("release %d: got released %d held %d total %d ttl %v, want %d %d %d", st.bytes, l.Released, l.Held, l.Total, l.TTL, st.released, st.held, st.total)
		}
	}
	// Releasing more than is held returns what is held.
	lease(t)(s.Acquire(ctx, "gpu0", a, 5, 0))
	if l := lease(t)(s.Release(ctx, "gpu0", a, 50)); l.Released != 5 || l.Held != 0 || l.Total != 20 {
		t.Errorf("over-release: released %d held %d total %d, want 5 0 20", l.Released, l.Held, l.Total)
	}
	f := listing(t)(s.Leases(ctx, "gpu0"))
	if f.Total != 20 || len(f.Holders) != 2 || f.Holders[0].Bytes != 0 || f.Holders[1].Bytes != 20 {
		t.Errorf("fleet after releases: %+v, want a announcing with no lease, b holding 20", f)
	}
}

// Replicas hammer one key at once. A grant reaches Redis before its answer
// reaches the replica, and a replica stops counting what it releases before
// it asks: so the bytes the replicas count as theirs never exceed what the
// store holds for them — and must never exceed the budget.
func contractConcurrentReplicasNeverExceedBudget(t *testing.T, h harness) {
	s, ctx := h.open(""), context.Background()
	const budget, replicas, ops = 1000, 6, 120
	var claimed atomic.Int64
	var wg sync.WaitGroup
	books := make([]int64, replicas)
	for i := range replicas {
		wg.Go(func() {
			r := req(fmt.Sprintf("r%d", i), budget)
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			for range ops {
				held := books[i]
				if held > 0 && rng.IntN(3) == 0 {
					n := 1 + rng.Int64N(held)
					claimed.Add(-n)
					l, err := s.Release(ctx, "gpu0", r, n)
					if err != nil {
						t.Error(err)
						return
					}
					books[i] -= n
					if l.Released != n || l.Held != books[i] {
						t.Errorf("%s released %d of %d: store released %d, holds %d", r.Replica, n, held, l.Released, l.Held)
					}
					continue
				}
				n := 1 + rng.Int64N(budget/3)
				l, err := s.Acquire(ctx, "gpu0", r, n, rng.Int64N(n+1))
				if err != nil {
					t.Error(err)
					return
				}
				books[i] += l.Granted
				if c := claimed.Add(l.Granted); c > budget || l.Total > budget {
					t.Errorf("over budget: replicas count %d, store totals %d, budget %d", c, l.Total, budget)
				}
				if l.Held != books[i] {
					t.Errorf("%s: store holds %d, replica counted %d", r.Replica, l.Held, books[i])
				}
			}
		})
	}
	wg.Wait()
	f := listing(t)(s.Leases(ctx, "gpu0"))
	var sum int64
	for i, b := range books {
		sum += b
		if got := holderBytes(f, fmt.Sprintf("r%d", i)); got != b {
			t.Errorf("r%d: fleet shows %d, replica counted %d", i, got, b)
		}
	}
	if f.Total != sum || f.Total > budget {
		t.Errorf("fleet total %d, replicas counted %d, budget %d", f.Total, sum, budget)
	}
	for i, b := range books {
		if b > 0 {
			lease(t)(s.Release(ctx, "gpu0", req(fmt.Sprintf("r%d", i), budget), b))
		}
	}
	if f := listing(t)(s.Leases(ctx, "gpu0")); f.Total != 0 {
		t.Errorf("after every release the fleet still holds %d", f.Total)
	}
}

func holderBytes(f sharedbudget.Listing, replica string) int64 {
	for _, h := range f.Holders {
		if h.Replica == replica {
			return h.Bytes
		}
	}
	return 0
}

// A replica that stops renewing (killed, cut off) loses its lease after its
// TTL, and only then: a renewed lease survives the same wait.
func contractLostLeaseComesBackAfterTTL(t *testing.T, h harness) {
	s, ctx := h.open(""), context.Background()
	// Two seconds leave room for a stalled machine between two calls.
	const ttl = 2 * time.Second
	short := func(replica string) sharedbudget.Request {
		return sharedbudget.Request{Replica: replica, Budget: 100, TTL: ttl}
	}
	lease(t)(s.Acquire(ctx, "gpu0", short("dead"), 60, 0))
	lease(t)(s.Acquire(ctx, "gpu0", short("alive"), 30, 0))
	if l := lease(t)(s.Renew(ctx, "gpu0", req("alive", 100))); l.Held != 30 || l.TTL <= ttl {
		t.Fatalf("renewed lease: held %d, ttl %v; want 30 and more than %v", l.Held, l.TTL, ttl)
	}
	if l := lease(t)(s.Acquire(ctx, "gpu0", req("new", 100), 60, 0)); l.Granted != 0 {
		t.Fatalf("a live lease's bytes were granted again: %+v", l)
	}
	h.advance(ttl)
	l := lease(t)(s.Acquire(ctx, "gpu0", req("new", 100), 60, 0))
	if l.Granted != 60 || l.Total != 90 {
		t.Errorf("after the dead replica's TTL: granted %d total %d, want 60 of its bytes back and 90 leased", l.Granted, l.Total)
	}
	if l := lease(t)(s.Renew(ctx, "gpu0", short("dead"))); l.Held != 0 || l.TTL != 0 {
		t.Errorf("the dead replica's renewal after its TTL: held %d ttl %v, want its lease gone", l.Held, l.TTL)
	}
	if got := holderBytes(listing(t)(s.Leases(ctx, "gpu0")), "alive"); got != 30 {
		t.Errorf("the renewed lease holds %d after the wait, want 30", got)
	}
}

// A lease past its TTL with a longer Residual is the replica's residual
// hold: nobody may lease it, the replica's next call revives it, and it goes
// once Residual has passed since that call. A lease given back goes at
// once, whatever its Residual.
func contractResidualHoldCountsUntilItsBound(t *testing.T, h harness) {
	s, ctx := h.open(""), context.Background()
	// A second of margin between the TTL and the bound, for a stalled
	// machine between two calls.
	const ttl, residual = time.Second, 2 * time.Second
	silent := sharedbudget.Request{Replica: "silent", Budget: 100, TTL: ttl, Residual: residual}
	lease(t)(s.Acquire(ctx, "gpu0", silent, 60, 0))
	lease(t)(s.Acquire(ctx, "gpu0", req("alive", 100), 30, 0))
	quits := sharedbudget.Request{Replica: "quits", Budget: 100, TTL: ttl, Residual: residual}
	lease(t)(s.Acquire(ctx, "gpu0", quits, 10, 0))
	if l := lease(t)(s.Release(ctx, "gpu0", quits, 10)); l.Held != 0 || l.Total != 90 {
		t.Fatalf("a lease given back: %+v, want it gone at once (total 90)", l)
	}

	h.advance(ttl)
	l := lease(t)(s.Acquire(ctx, "gpu0", req("new", 100), 60, 1))
	if l.Granted != 10 || l.Total != 100 || l.Residual != 60 {
		t.Errorf("past the silent replica's TTL: %+v, want only the 10 given back granted, 60 residual", l)
	}
	f := listing(t)(s.Leases(ctx, "gpu0"))
	if f.Residual != 60 || f.Total != 100 {
		t.Errorf("listing %+v, want 60 of 100 residual", f)
	}
	for _, hd := range f.Holders {
		if (hd.Replica == "silent") != hd.Residual {
			t.Errorf("holder %+v: only the silent replica is a residual hold", hd)
		}
		if hd.Replica == "silent" && (hd.TTL != 0 || hd.Keep <= 0 || hd.Keep > residual-ttl) {
			t.Errorf("silent holder %+v: want no TTL and under %v kept", hd, residual-ttl)
		}
	}

	// It calls again: the same lease, live, with its TTL and bound anew.
	if l := lease(t)(s.Renew(ctx, "gpu0", silent)); l.Held != 60 || l.TTL != ttl || l.Residual != 0 {
		t.Fatalf("the silent replica back: %+v, want its 60 live again", l)
	}
	if f := listing(t)(s.Leases(ctx, "gpu0")); f.Residual != 0 {
		t.Errorf("after its renewal: %+v, want no residual hold", f)
	}

	h.advance(residual)
	if l := lease(t)(s.Acquire(ctx, "gpu0", req("new", 100), 60, 0)); l.Granted != 60 || l.Residual != 0 {
		t.Errorf("past the bound: %+v, want the 60 granted", l)
	}
	if l := lease(t)(s.Renew(ctx, "gpu0", silent)); l.Held != 0 {
		t.Errorf("the silent replica back after the bound: %+v, want its lease gone", l)
	}
}

// Each call publishes what the caller's requests may hold (Holds); the
// others read the live replicas' sum (LiveHolds) and the listing shows each.
// DropResidual ends the residual holds at once and nothing else: not the
// live leases, not a hold its replica revived first.
func contractDropResidualEndsOnlyResidualHolds(t *testing.T, h harness) {
	s, ctx := h.open(""), context.Background()
	const ttl, residual = time.Second, time.Minute
	mk := func(name string, holds int64) sharedbudget.Request {
		return sharedbudget.Request{Replica: name, Budget: 100, TTL: ttl, Residual: residual, Holds: holds}
	}
	dead, paused, alive := mk("dead", 25), mk("paused", 15), sharedbudget.Request{Replica: "alive", Budget: 100, TTL: long, Holds: 20, Running: 2}
	lease(t)(s.Acquire(ctx, "gpu0", dead, 30, 0))
	lease(t)(s.Acquire(ctx, "gpu0", paused, 20, 0))
	if l := lease(t)(s.Acquire(ctx, "gpu0", alive, 30, 0)); l.LiveHolds != 40 || l.Dropped != 0 {
		t.Fatalf("alive's grant: %+v, want the others' 25+15 published holds, nothing dropped", l)
	}
	if l := lease(t)(s.DropResidual(ctx, "gpu0", alive)); l.Dropped != 0 || l.Total != 80 || l.Silent != 0 {
		t.Fatalf("a drop while every lease is fresh: %+v, want nothing dropped, nothing silent", l)
	}
	// Past half their TTL they missed a renewal: silent, their holds no
	// longer counted, but within their trust horizon: not dropped.
	h.advance(ttl * 6 / 10)
	if l := lease(t)(s.DropResidual(ctx, "gpu0", alive)); l.Dropped != 0 || l.Silent != 50 || l.LiveHolds != 0 {
		t.Fatalf("a drop within the others' trust horizon: %+v, want nothing dropped, 50 silent", l)
	}

	h.advance(ttl * 4 / 10)
	if l := lease(t)(s.Renew(ctx, "gpu0", alive)); l.Residual != 50 || l.LiveHolds != 0 {
		t.Fatalf("past the others' TTL: %+v, want 50 residual and no live holds", l)
	}
	if hd := holder(listing(t)(s.Leases(ctx, "gpu0")), "dead"); !hd.Residual || hd.Holds != 25 {
		t.Errorf("dead listed as %+v, want a residual hold that published 25", hd)
	}
	// paused calls again before the drop: its lease is live once more.
	if l := lease(t)(s.Renew(ctx, "gpu0", paused)); l.Held != 20 || l.LiveHolds != 20 || l.LiveRunning != 2 {
		t.Fatalf("paused back: %+v, want its 20 live again, alive's 20 holds of 2 requests seen", l)
	}
	l := lease(t)(s.DropResidual(ctx, "gpu0", alive))
	if l.Dropped != 30 || l.Total != 50 || l.Residual != 0 || l.Held != 30 || l.LiveHolds != 15 {
		t.Errorf("the drop: %+v, want dead's 30 gone, 50 left, alive's 30 kept", l)
	}
	if l := lease(t)(s.Acquire(ctx, "gpu0", alive, 50, 1)); l.Granted != 50 {
		t.Errorf("after the drop: %+v, want the 50 free granted", l)
	}
	if l := lease(t)(s.Renew(ctx, "gpu0", dead)); l.Held != 0 {
		t.Errorf("the dropped replica back: %+v, want its lease gone", l)
	}
	if hd := holder(listing(t)(s.Leases(ctx, "gpu0")), "dead"); hd.Bytes != 0 || hd.Holds != 0 {
		t.Errorf("dead listed as %+v after the drop, want nothing held", hd)
	}
}

func holder(f sharedbudget.Listing, replica string) sharedbudget.Holder {
	for _, h := range f.Holders {
		if h.Replica == replica {
			return h
		}
	}
	return sharedbudget.Holder{Replica: replica}
}

func contractSmallestBudgetWins(t *testing.T, h harness) {
	s, ctx := h.open(""), context.Background()
	if l := lease(t)(s.Acquire(ctx, "gpu0", req("unsure", 0), 1, 0)); l.Granted != 0 || l.Budget != 0 {
		t.Fatalf("with no announced budget: %+v, want nothing granted and budget 0", l)
	}
	lease(t)(s.Renew(ctx, "gpu0", req("big", 100)))
	lease(t)(s.Renew(ctx, "gpu0", req("small", 60)))
	if l := lease(t)(s.Acquire(ctx, "gpu0", req("big", 100), 80, 0)); l.Granted != 0 || l.Budget != 60 {
		t.Errorf("80 of a budget announced as 100 and 60: %+v, want refused under budget 60", l)
	}
	// A replica that does not know its budget defers to the others.
	if l := lease(t)(s.Acquire(ctx, "gpu0", req("unsure", 0), 80, 1)); l.Granted != 60 || l.Budget != 60 {
		t.Errorf("unannounced replica: %+v, want 60 granted under budget 60", l)
	}
	// Every replica now agrees on 100: the rest is grantable at once.
	lease(t)(s.Renew(ctx, "gpu0", req("small", 100)))
	if l := lease(t)(s.Acquire(ctx, "gpu0", req("big", 100), 40, 0)); l.Granted != 40 || l.Budget != 100 {
		t.Errorf("after every replica announced 100: %+v, want 40 granted", l)
	}
	// Lowering the budget under the leases revokes nothing; it only stops
	// further grants until the leases fit again.
	l := lease(t)(s.Renew(ctx, "gpu0", req("small", 50)))
	if l.Total != 100 || l.Budget != 50 {
		t.Errorf("after lowering to 50: %+v, want the 100 leased kept under budget 50", l)
	}
	lease(t)(s.Release(ctx, "gpu0", req("unsure", 0), 60))
	if l := lease(t)(s.Acquire(ctx, "gpu0", req("big", 100), 20, 1)); l.Granted != 10 {
		t.Errorf("after leases fell to 40 of 50: granted %d, want 10", l.Granted)
	}
}

// An announcement expires with its TTL, so a budget raised by the replicas
// that are still alive takes effect once the one that disagreed is gone.
func contractRaisedBudgetWaitsForTheLastAnnouncement(t *testing.T, h harness) {
	s, ctx := h.open(""), context.Background()
	lease(t)(s.Renew(ctx, "gpu0", sharedbudget.Request{Replica: "gone", Budget: 40, TTL: 200 * time.Millisecond}))
	lease(t)(s.Renew(ctx, "gpu0", req("raised", 100)))
	// The "gone" announcement may already have expired on a stalled
	// machine; what matters is that it counts until then, and not after.
	h.advance(200 * time.Millisecond)
	if l := lease(t)(s.Acquire(ctx, "gpu0", req("raised", 100), 90, 0)); l.Granted != 90 || l.Budget != 100 {
		t.Errorf("after the smaller announcement expired: %+v, want 90 granted under 100", l)
	}
}

func contractPrefixAndKeyIsolateBudgets(t *testing.T, h harness) {
	ctx := context.Background()
	a, b := h.open("a:"), h.open("b:")
	stores := []struct {
		name string
		s    sharedbudget.Store
		key  string
	}{
		{"a:gpu1", a, "gpu1"},
		{"b:gpu1", b, "gpu1"},
		// Keys that are prefixes of each other, or that look like the
		// store's own key layout, are separate budgets all the same.
		{"a:gpu10", a, "gpu10"},
		{"a:{gpu1}", a, "{gpu1}"},
		{"a:gpu1}:leases", a, "gpu1}:leases"},
		{"a:gpu1:", a, "gpu1:"},
	}
	for _, st := range stores {
		if l := lease(t)(st.s.Acquire(ctx, st.key, req("r", 100), 100, 0)); l.Granted != 100 || l.Total != 100 {
			t.Errorf("%s: %+v, want the whole budget of its own", st.name, l)
		}
	}
	for _, st := range stores {
		if f := listing(t)(st.s.Leases(ctx, st.key)); f.Total != 100 || len(f.Holders) != 1 {
			t.Errorf("%s: fleet %+v, want one holder of 100", st.name, f)
		}
	}
}

func contractErrorsNameTheKey(t *testing.T, h harness) {
	s := h.open("")
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	ok := req("r", 100)
	cases := []struct {
		name string
		call func() error
		is   error
	}{
		{"zero size", func() error { _, err := s.Acquire(ctx, "gpu-z", ok, 0, 0); return err }, sharedbudget.ErrInvalid},
		{"negative size", func() error { _, err := s.Release(ctx, "gpu-z", ok, -1); return err }, sharedbudget.ErrInvalid},
		{"size past MaxBytes", func() error { _, err := s.Acquire(ctx, "gpu-z", ok, sharedbudget.MaxBytes+1, 0); return err }, sharedbudget.ErrInvalid},
		{"least above size", func() error { _, err := s.Acquire(ctx, "gpu-z", ok, 5, 6); return err }, sharedbudget.ErrInvalid},
		{"negative least", func() error { _, err := s.Acquire(ctx, "gpu-z", ok, 5, -1); return err }, sharedbudget.ErrInvalid},
		{"no replica", func() error { _, err := s.Renew(ctx, "gpu-z", req("", 100)); return err }, sharedbudget.ErrInvalid},
		{"ttl below 1ms", func() error {
			_, err := s.Renew(ctx, "gpu-z", sharedbudget.Request{Replica: "r", TTL: time.Microsecond})
			return err
		}, sharedbudget.ErrInvalid},
		{"negative budget", func() error { _, err := s.Renew(ctx, "gpu-z", req("r", -1)); return err }, sharedbudget.ErrInvalid},
		{"cancelled context", func() error { _, err := s.Acquire(cancelled, "gpu-z", ok, 1, 0); return err }, context.Canceled},
		{"cancelled list", func() error { _, err := s.Leases(cancelled, "gpu-z"); return err }, context.Canceled},
	}
	for _, c := range cases {
		err := c.call()
		if !errors.Is(err, c.is) || !strings.Contains(fmt.Sprint(err), `"gpu-z"`) {
			t.Errorf("%s: error %v, want one wrapping %v that names the key", c.name, err, c.is)
		}
	}
	if _, err := s.Leases(ctx, ""); !errors.Is(err, sharedbudget.ErrInvalid) {
		t.Errorf("listing an empty key: %v, want ErrInvalid", err)
	}
	if f := listing(t)(s.Leases(ctx, "gpu-z")); f.Total != 0 || len(f.Holders) != 0 {
		t.Errorf("refused calls left state behind: %+v", f)
	}
}

func contractFleetListsEveryReplica(t *testing.T, h harness) {
	s, ctx := h.open(""), context.Background()
	if f := listing(t)(s.Leases(ctx, "gpu0")); f.Total != 0 || f.Budget != 0 || len(f.Holders) != 0 {
		t.Fatalf("unknown key: %+v, want an empty fleet", f)
	}
	lease(t)(s.Acquire(ctx, "gpu0", req("b", 90), 30, 0))
	lease(t)(s.Acquire(ctx, "gpu0", req("a", 100), 20, 0))
	lease(t)(s.Renew(ctx, "gpu0", req("c", 95)))
	lease(t)(s.Acquire(ctx, "gpu0", req("d", 0), 5, 0))
	f := listing(t)(s.Leases(ctx, "gpu0"))
	want := []sharedbudget.Holder{{Replica: "a", Bytes: 20, Budget: 100}, {Replica: "b", Bytes: 30, Budget: 90}, {Replica: "c", Budget: 95}, {Replica: "d", Bytes: 5}}
	if f.Budget != 90 || f.Total != 55 || len(f.Holders) != len(want) {
		t.Fatalf("fleet %+v, want budget 90, total 55, holders %+v", f, want)
	}
	for i, w := range want {
		g := f.Holders[i]
		if g.Replica != w.Replica || g.Bytes != w.Bytes || g.Budget != w.Budget || (g.Bytes > 0) != (g.TTL > 0) || g.TTL > long ||
			g.Residual || g.Keep != g.TTL {
			t.Errorf("holder %d: %+v, want %+v with a TTL when it holds bytes", i, g, w)
		}
	}
}

// Sizes up to MaxBytes survive the trip through Redis's Lua numbers.
func contractLargeSizesAreExact(t *testing.T, h harness) {
	s, ctx := h.open(""), context.Background()
	const budget = sharedbudget.MaxBytes - 1
	l := lease(t)(s.Acquire(ctx, "gpu0", req("a", budget), budget-3, 0))
	if l.Granted != budget-3 || l.Held != budget-3 || l.Budget != budget {
		t.Fatalf("large grant: %+v", l)
	}
	if l := lease(t)(s.Acquire(ctx, "gpu0", req("b", budget), 5, 1)); l.Granted != 3 || l.Total != budget {
		t.Errorf("the last 3 bytes of a large budget: %+v", l)
	}
	if l := lease(t)(s.Release(ctx, "gpu0", req("a", budget), 1)); l.Released != 1 || l.Held != budget-4 {
		t.Errorf("one byte back from a large lease: %+v", l)
	}
}
