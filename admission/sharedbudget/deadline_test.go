package sharedbudget

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
)

// Issue 26, R3: a replica cut off from Redis kept its lease for go-redis's
// own socket timeout (or forever with timeouts disabled in the URL),
// because go-redis ignored the lessee's call deadline. Each call must end
// at its context's deadline whatever Redis does, while Redis still has not
// answered.
func TestRedisCallEndsAtItsDeadline(t *testing.T) {
	r := sharedbudgettest.StartRedis(t)
	req := Request{Replica: "a", Budget: 1 << 30, TTL: 3 * time.Second}
	for _, tc := range []struct {
		name string
		// cut makes Redis stop answering and returns a channel closed once
		// it would answer again (nil: never, within the test).
		cut   func(t *testing.T, p *sharedbudgettest.HoleProxy) <-chan struct{}
		retry bool // the cut may have begun after the call was served
	}{
		{"redis under DEBUG SLEEP", func(t *testing.T, _ *sharedbudgettest.HoleProxy) <-chan struct{} {
			done := make(chan struct{})
			c := r.Client()
			// Connected already, so that the sleep usually reaches Redis
			// before the call, which goes through the proxy.
			if err := c.Ping(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			go func() {
				defer close(done)
				if err := c.Do(context.Background(), "DEBUG", "SLEEP", "2").Err(); err != nil {
					t.Errorf("DEBUG SLEEP: %v", err)
				}
			}()
			return done
		}, true},
		{"link blackholed", func(t *testing.T, p *sharedbudgettest.HoleProxy) <-chan struct{} {
			p.Cut()
			return nil
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := sharedbudgettest.StartHoleProxy(t, r.Addr())
			// Socket timeouts off: only the call's own deadline can end it.
			c, err := parse(t, "{redis: 'redis://"+p.Addr()+"/0?read_timeout=-1&write_timeout=-1', replicas: 2}")
			if err != nil {
				t.Fatal(err)
			}
			client := redis.NewClient(c.redisOpts)
			t.Cleanup(func() { _ = client.Close() })
			store := NewRedis(client, RedisOptions{Prefix: "t26:"})
			if _, err := store.Renew(context.Background(), "gpu0", req); err != nil {
				t.Fatalf("renew before the cut: %v", err)
			}
			for attempt := 0; ; attempt++ {
				answers := tc.cut(t, p)
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				type res struct{ err error }
				got := make(chan res, 1)
				go func() { _, err := store.Renew(ctx, "gpu0", req); got <- res{err} }()
				var err error
				select {
				case g := <-got:
					err = g.err
				case <-time.After(30 * time.Second): // a guard against hanging, not a measurement
					t.Fatal("the call is still waiting on Redis long after its deadline")
				}
				cancel()
				answered := false
				if answers != nil {
					select {
					case <-answers:
						answered = true
					default:
					}
				}
				switch {
				case err == nil && !answered && tc.retry && attempt < 5:
					<-answers // the call ran before the sleep began: again
					continue
				case err == nil:
					t.Fatal("the call waited for Redis to answer, past its deadline")
				case answered:
					t.Fatalf("the call ended only once Redis answered again: %v", err)
				case !errors.Is(err, ErrUnavailable):
					t.Fatalf("err = %v, want ErrUnavailable", err)
				}
				if answers != nil {
					<-answers
				}
				return
			}
		})
	}
}
