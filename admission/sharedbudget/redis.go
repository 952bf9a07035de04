package sharedbudget

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/admission"
)

//go:embed lease.lua
var leaseLua string

// leaseScript is shared by every Redis store: go-redis runs it by its SHA
// and sends the source again when a (restarted) server answers NOSCRIPT.
var leaseScript = redis.NewScript(leaseLua)

// RedisOptions configures a Redis store. The zero value is usable.
type RedisOptions struct {
	// Prefix namespaces every key, so that several fleets (staging,
	// production) can share one Redis. Default: none.
	Prefix string
	// Observe, if set, is called after every round trip with the operation
	// ("acquire", "renew", "release", "drop", "list"), how long it took and its
	// error (nil on success): the hook for a latency histogram. It runs on
	// the caller's goroutine and must be quick.
	Observe func(op string, took time.Duration, err error)
	// Now times the round trips for Observe. Default: the system clock's. Lease time
	// never comes from it: leases are timed by Redis's own clock.
	Now func() time.Time
}

// Redis is the Store shared by gateway replicas: one Lua script (lease.lua)
// does every change atomically inside Redis. It works with any go-redis
// client (single server, Sentinel failover, Cluster: a key's seven Redis keys
// share one hash tag) and is safe under the client's retries: each Acquire
// and Release carries an id, and a call the client sends twice is answered
// from the record of its first run.
type Redis struct {
	c       redis.Scripter
	prefix  string
	observe func(string, time.Duration, error)
	now     func() time.Time

	idBase string        // random per store, so ids never collide across processes
	seq    atomic.Uint64 // op ids within this store
}

var _ Store = (*Redis)(nil)

// NewRedis returns a store over client c. Give c ContextTimeoutEnabled:
// without it go-redis ignores a call's deadline on socket I/O, and a lessee
// cut off from Redis would wait out go-redis's own timeouts on a lease it
// no longer trusts.
func NewRedis(c redis.Scripter, o RedisOptions) *Redis {
	if o.Now == nil {
		o.Now = admission.SystemClock().Now
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return &Redis{c: c, prefix: o.Prefix, observe: o.Observe, now: o.Now, idBase: hex.EncodeToString(b[:])}
}

// keys are the script's KEYS for a budget key. The braces make them one hash
// tag (one Cluster slot); the suffixes are chosen so that no two keys of any
// two budget keys are equal.
func (s *Redis) keys(key string) []string {
	base := s.prefix + "{" + key + "}:"
	return []string{base + "leases", base + "leases:exp", base + "budgets", base + "budgets:exp", base + "ops", base + "leases:keep", base + "holds"}
}

func (s *Redis) opID() string {
	return s.idBase + "-" + strconv.FormatUint(s.seq.Add(1), 36)
}

// Acquire implements Store.
func (s *Redis) Acquire(ctx context.Context, key string, r Request, bytes, least int64) (Lease, error) {
	least, err := checkAcquire(key, r, bytes, least)
	if err != nil {
		return Lease{}, opError("acquire", key, r.Replica, err)
	}
	return s.run(ctx, "acquire", key, r, bytes, least, s.opID())
}

// Renew implements Store.
func (s *Redis) Renew(ctx context.Context, key string, r Request) (Lease, error) {
	if err := check(key, r); err != nil {
		return Lease{}, opError("renew", key, r.Replica, err)
	}
	return s.run(ctx, "renew", key, r, 0, 0, "")
}

// Release implements Store.
func (s *Redis) Release(ctx context.Context, key string, r Request, bytes int64) (Lease, error) {
	if err := checkRelease(key, r, bytes); err != nil {
		return Lease{}, opError("release", key, r.Replica, err)
	}
	return s.run(ctx, "release", key, r, bytes, 0, s.opID())
}

// DropResidual implements Store.
func (s *Redis) DropResidual(ctx context.Context, key string, r Request) (Lease, error) {
	if err := check(key, r); err != nil {
		return Lease{}, opError("drop", key, r.Replica, err)
	}
	return s.run(ctx, "drop", key, r, 0, 0, s.opID())
}

func (s *Redis) run(ctx context.Context, op, key string, r Request, bytes, least int64, id string) (Lease, error) {
	ttl := r.TTL.Milliseconds()
	v, err := s.eval(ctx, op, key, []any{op, r.Replica, bytes, least, r.Budget, ttl, id, r.Residual.Milliseconds(), r.Holds, r.Running})
	if err != nil {
		return Lease{}, opError(op, key, r.Replica, err)
	}
	n, err := ints(v, 9)
	if err != nil {
		return Lease{}, opError(op, key, r.Replica, err)
	}
	l := Lease{Held: n[1], TTL: time.Duration(n[2]) * time.Millisecond, Total: n[3], Budget: n[4], Residual: n[5], LiveHolds: n[6], Silent: n[7], LiveRunning: n[8]}
	switch op {
	case "acquire":
		l.Granted = n[0]
	case "release":
		l.Released = n[0]
	case "drop":
		l.Dropped = n[0]
	}
	return l, nil
}

// Leases implements Store.
func (s *Redis) Leases(ctx context.Context, key string) (Listing, error) {
	if key == "" {
		return Listing{}, opError("list", key, "", invalid("empty key"))
	}
	v, err := s.eval(ctx, "list", key, []any{"list", "", 0, 0, 0, 0, "", 0, 0, 0})
	if err != nil {
		return Listing{}, opError("list", key, "", err)
	}
	f, err := parseListing(v)
	if err != nil {
		return Listing{}, opError("list", key, "", err)
	}
	return f, nil
}

// eval runs the script once (go-redis may retry it on a broken connection;
// the op id makes that harmless), times it for Observe, and classifies its
// error.
func (s *Redis) eval(ctx context.Context, op, key string, args []any) (any, error) {
	start := s.now()
	v, err := leaseScript.Run(ctx, s.c, s.keys(key), args...).Result()
	if s.observe != nil {
		s.observe(op, s.now().Sub(start), err)
	}
	if err == nil {
		return v, nil
	}
	var replyErr redis.Error
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller gave up; that says nothing about Redis. (A deadline
		// that passed does: Redis did not answer in time.)
		return nil, fmt.Errorf("%w (%w)", ctx.Err(), err)
	case errors.As(err, &replyErr) && !passing(err):
		// Redis answered with an error (a key of the wrong type, a script
		// error): a fault to show, not an outage to wait out.
		return nil, err
	}
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// passing tells the Redis error answers that mean "not now" (loading after a
// restart, a replica promoted or demoted, a cluster resharding) from faults.
func passing(err error) bool {
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsMasterDownError(err) ||
		redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsMaxClientsError(err)
}

func ints(v any, n int) ([]int64, error) {
	a, ok := v.([]any)
	if !ok || len(a) != n {
		return nil, fmt.Errorf("unexpected script answer %v", v)
	}
	out := make([]int64, n)
	for i, x := range a {
		var err error
		if out[i], err = toInt(x); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func toInt(x any) (int64, error) {
	switch x := x.(type) {
	case int64:
		return x, nil
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected number %q in script answer", x)
		}
		return n, nil
	}
	return 0, fmt.Errorf("unexpected %T %v in script answer", x, x)
}

// parseListing reads the list answer: budget, total, residual holds, then
// sextuples of replica, bytes, ttl ms, announced budget, keep ms, holds. The
// script lists leaseholders first, then announcers, each once.
func parseListing(v any) (Listing, error) {
	a, ok := v.([]any)
	if !ok || len(a) < 3 || (len(a)-3)%6 != 0 {
		return Listing{}, fmt.Errorf("unexpected script answer %v", v)
	}
	var f Listing
	head, err := ints(a[:3], 3)
	if err != nil {
		return Listing{}, err
	}
	f.Budget, f.Total, f.Residual = head[0], head[1], head[2]
	for i := 3; i < len(a); i += 6 {
		replica, ok := a[i].(string)
		if !ok {
			return Listing{}, fmt.Errorf("unexpected replica %v in script answer", a[i])
		}
		n, err := ints(a[i+1:i+6], 5)
		if err != nil {
			return Listing{}, err
		}
		f.Holders = append(f.Holders, Holder{Replica: replica, Bytes: n[0], TTL: time.Duration(n[1]) * time.Millisecond, Budget: n[2],
			Keep: time.Duration(n[3]) * time.Millisecond, Residual: n[0] > 0 && n[1] <= 0, Holds: n[4]})
	}
	sortHolders(f.Holders)
	return f, nil
}
