package sharedbudget_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/sharedbudget"
	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
)

// hang bounds every wait for an event in the tests on a real Redis: on two
// busy cores the events come within seconds; reaching it means they never
// will.
const hang = 30 * time.Second

// running is a Lessee run by Run on the system clock, with a pool whose
// capacity changes arrive on a channel.
type running struct {
	l    *sharedbudget.Lessee
	p    *pool
	caps chan int64
	stop context.CancelFunc
	done chan struct{}
}

func runLessee(t *testing.T, s sharedbudget.Store, replica string, ttl time.Duration) *running {
	x := &running{p: &pool{}, caps: make(chan int64, 1024), done: make(chan struct{})}
	l, err := sharedbudget.NewLessee(sharedbudget.LesseeConfig{
		Store: s, Key: "gpu0", Replica: replica, Replicas: 2, Budget: 1000, Chunk: 100, TTL: ttl,
		Hysteresis: time.Hour, // nothing goes back unless a test says so
		Demand:     x.p.Demand,
		OnCapacity: func(c int64) {
			x.p.OnCapacity(c)
			select {
			case x.caps <- c:
			default:
				t.Error("capacity changes not consumed")
			}
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	x.l = l
	ctx, cancel := context.WithCancel(context.Background())
	x.stop = func() {
		cancel()
		<-x.done
	}
	go func() {
		defer close(x.done)
		_ = l.Run(ctx)
	}()
	t.Cleanup(x.stop)
	return x
}

// demand sets the pool's demand and wakes the lessee, as the pool would.
func (x *running) demand(held, queued int64) {
	x.p.set(held, queued)
	x.l.Wake()
}

// waitCapacity waits until the pool is given capacity c.
func (x *running) waitCapacity(t *testing.T, c int64, what string) {
	t.Helper()
	deadline := time.After(hang)
	for {
		select {
		case got := <-x.caps:
			if got == c {
				return
			}
		case <-deadline:
			t.Fatalf("%s: capacity %d never came; stats %+v", what, c, x.l.Stats())
		}
	}
}

// A replica killed while holding leases (it stops renewing, and gives
// nothing back) frees its capacity after the TTL: the other replica, which
// wants it, gets it.
func TestLesseeOnRedisKilledReplicasCapacityComesBack(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	s := sharedbudget.NewRedis(srv.Client(), sharedbudget.RedisOptions{Prefix: "kvgate:"})
	const ttl = time.Second
	a := runLessee(t, s, "a", ttl)
	a.demand(0, 1000)
	a.waitCapacity(t, 1000, "a leasing the whole budget")
	b := runLessee(t, s, "b", ttl)
	b.demand(0, 600)
	if s := b.l.Stats(); s.Capacity != 0 {
		t.Fatalf("b got capacity %d while a held the whole budget", s.Capacity)
	}
	a.stop() // kill -9: no Shutdown
	killed := time.Now()
	b.waitCapacity(t, 600, "b taking the dead replica's capacity")
	t.Logf("b had the dead replica's capacity %v after the kill (TTL %v)", time.Since(killed).Round(time.Millisecond), ttl)
}

// Redis stops: the replicas serve on the smaller of their lease and their
// static share. Redis comes back empty: they re-lease what they hold, then
// grow again.
func TestLesseeOnRedisServesThroughStopAndRestart(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	s := sharedbudget.NewRedis(srv.Client(), sharedbudget.RedisOptions{Prefix: "kvgate:"})
	const ttl = 1500 * time.Millisecond
	a, b := runLessee(t, s, "a", ttl), runLessee(t, s, "b", ttl)
	a.demand(0, 600)
	a.waitCapacity(t, 600, "a leasing")
	b.demand(0, 400)
	b.waitCapacity(t, 400, "b leasing")
	a.demand(600, 0)
	b.demand(400, 0)

	srv.Stop()
	a.waitCapacity(t, 500, "a on its static share")
	if st := a.l.Stats(); !st.Fallback || st.Share != 500 {
		t.Errorf("a: %+v, want fallback on share 500", st)
	}

	srv.Restart()
	// a held 600 through the outage (nothing is revoked): it re-leases
	// that before anything else, and its capacity comes back to 600 once
	// the rejoin window is over.
	a.waitCapacity(t, 600, "a back on its lease")
	fl := listing(t)(s.Leases(context.Background(), "gpu0"))
	if fl.Total != 1000 || holderBytes(fl, "a") != 600 || holderBytes(fl, "b") != 400 {
		t.Errorf("after Redis came back: %+v, want a 600 and b 400 leased again", fl)
	}
	if st := a.l.Stats(); st.Fallback || st.Leased != 600 || st.Failures == 0 {
		t.Errorf("a: %+v, want out of fallback with 600 leased, failures counted", st)
	}
}
