package sharedbudget_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/admission/sharedbudget"
)

// slowStore takes rtt of the manual clock to answer each call, as a store
// across a network does.
type slowStore struct {
	sharedbudget.Store
	clock *admissiontest.Clock
	rtt   time.Duration
}

func (s *slowStore) Acquire(ctx context.Context, key string, r sharedbudget.Request, bytes, least int64) (sharedbudget.Lease, error) {
	s.clock.Advance(s.rtt)
	return s.Store.Acquire(ctx, key, r, bytes, least)
}

func (s *slowStore) Renew(ctx context.Context, key string, r sharedbudget.Request) (sharedbudget.Lease, error) {
	s.clock.Advance(s.rtt)
	return s.Store.Renew(ctx, key, r)
}

// Issue 26, R2: the pool learns how long it may trust its capacity. The
// horizon is TTL − TTL/3 from when the call that last confirmed the lease
// was sent, not from when its answer came (a slow round trip eats into the
// lease, not past it); every renewal moves it; a fallback's static share
// has none.
func TestLesseeHorizonFromWhenTheCallWasSent(t *testing.T) {
	const ttl = 3 * time.Second
	for _, tc := range []struct {
		name string
		rtt  time.Duration
	}{{"instant store", 0}, {"slow store", 400 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			store := &slowStore{Store: r.store, clock: r.clock, rtt: tc.rtt}
			type trust struct {
				c     int64
				until time.Time
			}
			var got []trust
			l, p := r.lessee("a", func(c *sharedbudget.LesseeConfig) {
				c.Store = store
				c.OnCapacity = nil
				c.OnTrust = func(capacity int64, until time.Time) { got = append(got, trust{capacity, until}) }
			})
			p.set(0, 300)
			// The first step renews, then asks for the grant once the
			// renewal has answered: the grant is asked rtt after the start
			// and answered 2 rtt after it.
			asked := r.clock.Now().Add(tc.rtt)
			next := l.Step(r.ctx)
			if want := asked.Add(ttl - ttl/3); len(got) != 1 || got[0].c != 300 || !got[0].until.Equal(want) {
				t.Fatalf("after the grant: %+v, want capacity 300 trusted until %v (TTL − TTL/3 after the grant was asked)", got, want)
			}
			got = nil
			// The heartbeat is due TTL/3 after the last call was sent.
			r.clock.Advance(next.Sub(r.clock.Now()))
			renewSent := r.clock.Now()
			l.Step(r.ctx)
			if len(got) != 1 || got[0].c != 300 || !got[0].until.Equal(renewSent.Add(ttl-ttl/3)) {
				t.Fatalf("after a renewal sent at %v: %+v, want the horizon moved to %v", renewSent, got, renewSent.Add(ttl-ttl/3))
			}
			got = nil
			// The store goes away: past the horizon the lessee serves on
			// its share (500 of 1000 for 2 replicas, capped by its 300),
			// with no horizon.
			r.store.set(r.store.s, true)
			r.drive(ttl, nil, l)
			if n := len(got); n == 0 || got[n-1].c != 300 || !got[n-1].until.IsZero() || !l.Stats().Fallback {
				t.Fatalf("in the fallback: %+v (%+v), want capacity 300 with no horizon", got, l.Stats())
			}
		})
	}
}
