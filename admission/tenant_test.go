package admission_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/internal/confval"
)

func twoTenants(shareA, shareB float64) admission.Config {
	return oneGPU(10, admission.Config{Tenants: []admission.TenantConfig{
		{Name: "a", Share: shareA}, {Name: "b", Share: shareB}}})
}

// The liveness case of the fairness policy: tenant a floods the queue with
// long requests it has no quota left for; tenant b's short ones must keep
// flowing. Without the skip rule the loop below hangs.
func TestTenantFloodingLongRequestsDoesNotStarveAnother(t *testing.T) {
	f := newFixture(t, twoTenants(0.5, 0.5))
	longA := f.acquire(req("", "a", 4))
	var floods []<-chan result
	for range 5 {
		floods = append(floods, f.enqueue(context.Background(), req("", "a", 4)))
	}
	f.state(4, 5)
	for range 1000 { // b's short requests go straight past a's queued ones
		f.acquire(req("", "b", 1)).Release()
	}
	// b at its own cap queues too, and is served as soon as b frees room,
	// still ahead of a's waiters that wait for a's quota.
	var bs []*admission.Ticket
	for range 5 {
		bs = append(bs, f.acquire(req("", "b", 1)))
	}
	b6 := f.enqueue(context.Background(), req("", "b", 1))
	f.state(9, 6)
	bs[0].Release()
	bs[0] = f.admitted(b6)
	f.state(9, 5)
	// a's waiters are served in a's order as a's quota frees.
	longA.Release()
	first := f.admitted(floods[0])
	f.state(9, 4)
	f.stillQueued(floods[1:]...)
	first.Release()
	f.admitted(floods[1]).Release()
	for _, ch := range floods[2:] {
		f.admitted(ch).Release()
	}
	for _, tk := range bs {
		tk.Release()
	}
	f.state(0, 0)
}

// A tenant's requests stay in order among themselves: a small request of a
// tenant does not overtake its own large one that waits for quota (else the
// large one could starve behind its tenant's small ones).
func TestTenantOwnRequestsStayFIFO(t *testing.T) {
	f := newFixture(t, twoTenants(0.5, 0.5))
	a3 := f.acquire(req("", "a", 3))
	large := f.enqueue(context.Background(), req("", "a", 4))          // 3+4 > 5: over a's cap
	small := f.enqueue(context.Background(), req("", "a", 2))          // would fit a's cap, must wait behind large
	later := f.enqueue(context.Background(), req("sheddable", "a", 1)) // lower class of the same tenant waits too
	f.state(3, 3)
	f.acquire(req("", "b", 5)).Release() // other tenants are not held back
	a3.Release()
	tl := f.admitted(large)
	f.state(4, 2) // small: 4+2 > 5
	tl.Release()
	ts := f.admitted(small)
	f.admitted(later).Release()
	ts.Release()
	f.state(0, 0)
}

// A higher class of a tenant may pass that tenant's own waiter of a lower
// class (priority applies within a tenant as well).
func TestTenantHigherClassPassesItsOwnLowerClassWaiter(t *testing.T) {
	f := newFixture(t, twoTenants(0.5, 0.5))
	a4 := f.acquire(req("", "a", 4))
	low := f.enqueue(context.Background(), req("standard", "a", 3))
	f.acquire(req("critical", "a", 1)).Release()
	a4.Release()
	f.admitted(low).Release()
	f.state(0, 0)
}

// The other half of the policy: a waiter within its tenant's cap that lacks
// global capacity blocks everyone behind it, whatever their tenant.
func TestWaiterShortOfGlobalCapacityBlocksOtherTenants(t *testing.T) {
	cfg := twoTenants(1, 1)
	cfg.Backfill = strictOrder
	f := newFixture(t, cfg)
	b8 := f.acquire(req("", "b", 8))
	a5 := f.enqueue(context.Background(), req("", "a", 5))
	b1 := f.enqueue(context.Background(), req("", "b", 1)) // fits, but must not overtake
	f.state(8, 2)
	b8.Release()
	f.admitted(a5).Release()
	f.admitted(b1).Release()
	f.state(0, 0)
}

func TestTenantQueueShare(t *testing.T) {
	cfg := oneGPU(10, admission.Config{Backfill: strictOrder, Classes: []admission.ClassConfig{{Name: "standard", ClassLimits: admission.ClassLimits{MaxQueued: 10, MaxQueuedBytes: confval.Size{Bytes: 100}}}},
		Tenants: []admission.TenantConfig{{Name: "a", Share: 1, QueueShare: 0.25}, {Name: "b", Share: 0.5}}})
	f := newFixture(t, cfg)
	hold := f.acquire(req("", "b", 5))
	hold2 := f.acquire(req("", "a", 5))
	// a: ceil(0.25×10) = 3 waiters, ceil(0.25×100) = 25 bytes.
	var chs []<-chan result
	for range 3 {
		chs = append(chs, f.enqueue(context.Background(), req("", "a", 1)))
	}
	f.reject(req("", "a", 1), admission.ErrQueueFull)
	// b's QueueShare defaults to its Share, 0.5: 5 waiters, 50 bytes.
	for range 5 {
		chs = append(chs, f.enqueue(context.Background(), req("", "b", 1)))
	}
	f.reject(req("", "b", 1), admission.ErrQueueFull)
	hold.Release()
	hold2.Release()
	for _, ch := range chs {
		f.admitted(ch).Release()
	}
	f.state(0, 0)
	f2 := newFixture(t, cfg)
	h := f2.acquire(req("", "a", 10))
	c1 := f2.enqueue(context.Background(), req("", "a", 10))
	c2 := f2.enqueue(context.Background(), req("", "a", 10))
	f2.reject(req("", "a", 6), admission.ErrQueueFull) // 26 > 25 bytes
	h.Release()
	f2.admitted(c1).Release()
	f2.admitted(c2).Release()
}

// Found by TestStress: a waiter over its tenant's cap, queued in a higher
// class than that tenant's head-of-line blocker, makes the blocker skipped
// too (a tenant's waiters never pass its earlier ones), so the blocker must
// stop holding back other tenants.
func TestSkippedWaiterAheadOfItsTenantsBlockerUnblocksOthers(t *testing.T) {
	f := newFixture(t, twoTenants(0.5, 1))
	a2 := f.acquire(req("", "a", 2))
	b7 := f.acquire(req("", "b", 7))
	blocker := f.enqueue(context.Background(), req("standard", "a", 3)) // within a's cap, lacks capacity
	over := f.enqueue(context.Background(), req("critical", "a", 4))    // over a's cap: skipped, and so now is the blocker
	f.acquire(req("standard", "b", 1)).Release()                        // no longer held back
	a2.Release()                                                        // a holds 0: the critical one (4) fits a's cap and the 1 free? no: 7+4 > 10
	f.state(7, 2)
	b7.Release()
	to := f.admitted(over)
	f.state(4, 1) // a: 4+3 > 5, the standard one waits for a's quota
	to.Release()
	f.admitted(blocker).Release()
	f.state(0, 0)
}

// What other replicas of a fleet hold for a tenant on the GPU counts
// against its share here: a at 0.5 of 10, holding 3 elsewhere, gets 2 here;
// b is not held back; when a's holds elsewhere fall its waiter is admitted.
// TenantHolds publishes what each capped tenant holds and wants.
func TestTenantShareCountsWhatOtherReplicasHold(t *testing.T) {
	f := newFixture(t, twoTenants(0.5, 0.5))
	gpu := f.b.Stats().GPUs[0].Name
	if err := f.b.SetTenantsElsewhere(gpu, map[string]admission.TenantLoad{"a": {Held: 3, Demand: 3}}); err != nil {
		t.Fatal(err)
	}
	a1 := f.acquire(req("", "a", 2))
	a2 := f.enqueue(context.Background(), req("", "a", 1))
	b1 := f.acquire(req("", "b", 5))
	f.state(7, 1)
	want := map[string]admission.TenantLoad{"a": {Held: 2, Demand: 3}, "b": {Held: 5, Demand: 5}}
	if got := f.b.TenantHolds(gpu); !reflect.DeepEqual(got, want) {
		t.Errorf("TenantHolds = %v, want %v", got, want)
	}
	// a's part here is now 5 × 3/(3+2) = 3: room for its waiter.
	if err := f.b.SetTenantsElsewhere(gpu, map[string]admission.TenantLoad{"a": {Held: 2, Demand: 2}}); err != nil {
		t.Fatal(err)
	}
	f.admitted(a2).Release()
	a1.Release()
	b1.Release()
	f.state(0, 0)
	if err := f.b.SetTenantsElsewhere("nope", nil); err == nil {
		t.Error("an unknown GPU was accepted")
	}
}

// Replicas that see the same room at once each take their part of it, in
// proportion to the tenant's demand on each, not all of it: a (share 0.5
// of 10) holding nothing elsewhere yet but wanting there as much as here
// fills half its share here, and the rest when the others' demand ends. A
// replica holding nothing for the tenant takes one request whatever its
// part, so that none starves.
func TestTenantPartsSplitTheRoomByDemand(t *testing.T) {
	cases := []struct {
		name        string
		others      admission.TenantLoad
		wantHolding int64 // of a's five requests of 1 queued here
	}{
		{"alone", admission.TenantLoad{}, 5},
		{"as much demand elsewhere", admission.TenantLoad{Demand: 5}, 2},
		{"four times as much elsewhere", admission.TenantLoad{Demand: 20}, 1},
		{"held elsewhere", admission.TenantLoad{Held: 3, Demand: 3}, 2},
		{"its share held elsewhere", admission.TenantLoad{Held: 5, Demand: 5}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, twoTenants(0.5, 1))
			gpu := f.b.Stats().GPUs[0].Name
			if err := f.b.SetTenantsElsewhere(gpu, map[string]admission.TenantLoad{"a": c.others}); err != nil {
				t.Fatal(err)
			}
			// A blocker of b's keeps a's requests queued until all five are.
			blocker := f.acquire(req("", "b", 10))
			var waits []<-chan result
			for range 5 {
				waits = append(waits, f.enqueue(context.Background(), req("", "a", 1)))
			}
			blocker.Release()
			if st := f.b.Stats(); st.Held != c.wantHolding || st.Queued != 5-int(c.wantHolding) {
				t.Fatalf("a holds %d with %d queued, want %d", st.Held, st.Queued, c.wantHolding)
			}
			// The others' demand ends: the rest of the share is a's here.
			if err := f.b.SetTenantsElsewhere(gpu, nil); err != nil {
				t.Fatal(err)
			}
			for _, w := range waits {
				f.admitted(w).Release()
			}
			f.state(0, 0)
		})
	}
}
