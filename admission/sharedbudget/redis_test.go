package sharedbudget_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/admission/sharedbudget"
	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
)

// Redis stops (its data gone, as without persistence) and comes back on the
// same port: calls fail meanwhile with ErrUnavailable naming the key, and
// afterwards work again on an empty store (the script is sent again after
// the restarted server's NOSCRIPT).
func TestRedisStopsAndReturns(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	noRetry := func(o *redis.Options) { o.MaxRetries = -1 }
	s := sharedbudget.NewRedis(srv.Client(noRetry), sharedbudget.RedisOptions{Prefix: "kvgate:"})
	ctx := context.Background()
	if l := lease(t)(s.Acquire(ctx, "gpu0", req("a", 100), 40, 0)); l.Granted != 40 {
		t.Fatalf("granted %d, want 40", l.Granted)
	}
	srv.Stop()
	calls := map[string]func() error{
		"acquire": func() error { _, err := s.Acquire(ctx, "gpu0", req("a", 100), 10, 0); return err },
		"renew":   func() error { _, err := s.Renew(ctx, "gpu0", req("a", 100)); return err },
		"release": func() error { _, err := s.Release(ctx, "gpu0", req("a", 100), 10); return err },
		"list":    func() error { _, err := s.Leases(ctx, "gpu0"); return err },
	}
	for op, call := range calls {
		err := call()
		var netErr *net.OpError
		if !errors.Is(err, sharedbudget.ErrUnavailable) || !errors.As(err, &netErr) || !strings.Contains(err.Error(), `"gpu0"`) || !strings.Contains(err.Error(), op) {
			t.Errorf("%s with Redis stopped: %v, want ErrUnavailable wrapping the network error, naming %s and the key", op, err, op)
		}
	}
	// A call that Redis does not answer before its deadline is an outage
	// too, not the caller's cancellation.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	slow := sharedbudget.NewRedis(srv.Client(), sharedbudget.RedisOptions{}) // go-redis retries until the deadline
	if _, err := slow.Renew(short, "gpu0", req("a", 100)); !errors.Is(err, sharedbudget.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("renew past its deadline with Redis stopped: %v, want ErrUnavailable and the deadline", err)
	}
	srv.Restart()
	if l := lease(t)(s.Renew(ctx, "gpu0", req("a", 100))); l.Held != 0 || l.Total != 0 {
		t.Errorf("after a restart without persistence: %+v, want the lease gone", l)
	}
	if l := lease(t)(s.Acquire(ctx, "gpu0", req("a", 100), 100, 0)); l.Granted != 100 {
		t.Errorf("after the restart: granted %d, want the whole budget", l.Granted)
	}
}

// doubleSend makes the client send every command twice and answer with the
// second reply: what go-redis does when a connection breaks after a script
// ran but before its answer arrived.
type doubleSend struct{}

func (doubleSend) DialHook(next redis.DialHook) redis.DialHook { return next }
func (doubleSend) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (doubleSend) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		_ = next(ctx, cmd)
		return next(ctx, cmd)
	}
}

func TestRedisRetriedCallIsAnsweredNotRedone(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	c := srv.Client()
	c.AddHook(doubleSend{})
	s, ctx := sharedbudget.NewRedis(c, sharedbudget.RedisOptions{}), context.Background()
	steps := []struct {
		name               string
		call               func() (sharedbudget.Lease, error)
		granted, released  int64
		held, total, owned int64
	}{
		{"acquire 30", func() (sharedbudget.Lease, error) { return s.Acquire(ctx, "gpu0", req("a", 100), 30, 0) }, 30, 0, 30, 30, 30},
		{"acquire 50", func() (sharedbudget.Lease, error) { return s.Acquire(ctx, "gpu0", req("a", 100), 50, 0) }, 50, 0, 80, 80, 80},
		{"release 20", func() (sharedbudget.Lease, error) { return s.Release(ctx, "gpu0", req("a", 100), 20) }, 0, 20, 60, 60, 60},
		{"release 60", func() (sharedbudget.Lease, error) { return s.Release(ctx, "gpu0", req("a", 100), 60) }, 0, 60, 0, 0, 0},
	}
	for _, st := range steps {
		l := lease(t)(st.call())
		if l.Granted != st.granted || l.Released != st.released || l.Held != st.held || l.Total != st.total {
			t.Errorf("%s sent twice: %+v, want granted %d released %d held %d total %d", st.name, l, st.granted, st.released, st.held, st.total)
		}
	}
}

func TestRedisObservesEveryRoundTrip(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	var mu sync.Mutex
	type seen struct {
		op   string
		took time.Duration
		err  bool
	}
	var got []seen
	var now time.Time
	s := sharedbudget.NewRedis(srv.Client(func(o *redis.Options) { o.MaxRetries = -1 }), sharedbudget.RedisOptions{
		// Each reading of the clock moves it 7ms: every round trip takes
		// exactly 7ms.
		Now: func() time.Time { now = now.Add(7 * time.Millisecond); return now },
		Observe: func(op string, took time.Duration, err error) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, seen{op, took, err != nil})
		},
	})
	ctx := context.Background()
	lease(t)(s.Acquire(ctx, "gpu0", req("a", 100), 1, 0))
	lease(t)(s.Renew(ctx, "gpu0", req("a", 100)))
	lease(t)(s.Release(ctx, "gpu0", req("a", 100), 1))
	listing(t)(s.Leases(ctx, "gpu0"))
	if _, err := s.Acquire(ctx, "gpu0", req("a", 100), 0, 0); err == nil {
		t.Fatal("a zero acquire was accepted")
	}
	srv.Stop()
	if _, err := s.Renew(ctx, "gpu0", req("a", 100)); err == nil {
		t.Fatal("a renew with Redis stopped succeeded")
	}
	want := []seen{{"acquire", 7 * time.Millisecond, false}, {"renew", 7 * time.Millisecond, false},
		{"release", 7 * time.Millisecond, false}, {"list", 7 * time.Millisecond, false}, {"renew", 7 * time.Millisecond, true}}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("observed %+v, want %+v (no round trip for a refused argument)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("observation %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// A key that holds something else is a fault to show, not an outage.
func TestRedisWrongTypeIsAFaultNotAnOutage(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	c := srv.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "p:{gpu0}:leases", "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s := sharedbudget.NewRedis(c, sharedbudget.RedisOptions{Prefix: "p:"})
	_, err := s.Acquire(ctx, "gpu0", req("a", 100), 1, 0)
	if err == nil || errors.Is(err, sharedbudget.ErrUnavailable) || !strings.Contains(err.Error(), `"gpu0"`) {
		t.Errorf("acquire over a string key: %v, want an error naming the key that is not ErrUnavailable", err)
	}
}
