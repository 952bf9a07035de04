package sharedbudget

import (
	"context"
	"sync"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// Memory is the in-process Store: the reference that the Redis store is
// tested against, and the store of a gateway that runs alone. Several
// Lessees in one process may share it. It keeps the same books as the Lua
// script (see doc.go) under one mutex, with time from now.
type Memory struct {
	s      *memState
	prefix string
}

var _ Store = (*Memory)(nil)

type memState struct {
	now func() time.Time

	mu   sync.Mutex          // guards keys and everything under it
	keys map[string]*memBook // by prefixed key
}

// memBook is one key's books: what the script keeps in its five Redis keys,
// less the retry records that only a network needs.
type memBook struct {
	leases  map[string]memEntry // replica -> lease bytes
	budgets map[string]memEntry // replica -> announced budget
}

type memEntry struct {
	n       int64
	holds   int64         // a lease's published holds (Request.Holds)
	ttl     time.Duration // a lease's TTL at its last call
	running int64         // how many requests holds is of
	expires time.Time     // not live once now >= expires
	keep    time.Time     // a lease counts on (a residual hold) until then; zero: until expires
}

// gone says whether e no longer counts at now.
func (e memEntry) gone(now time.Time) bool {
	return !now.Before(e.expires) && !now.Before(e.keep)
}

// residual says whether e is a residual hold at now: not live, still
// counted.
func (e memEntry) residual(now time.Time) bool {
	return !now.Before(e.expires) && !e.gone(now)
}

// NewMemory returns an empty in-process store reading time from now
// (the system clock's if nil).
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = admission.SystemClock().Now
	}
	return &Memory{s: &memState{now: now, keys: map[string]*memBook{}}}
}

// Prefixed returns a view of the same store whose keys live under prefix,
// apart from every other prefix's: the in-process counterpart of
// RedisOptions.Prefix.
func (m *Memory) Prefixed(prefix string) *Memory {
	return &Memory{s: m.s, prefix: m.prefix + prefix}
}

// Acquire implements Store.
func (m *Memory) Acquire(ctx context.Context, key string, r Request, bytes, least int64) (Lease, error) {
	least, err := checkAcquire(key, r, bytes, least)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return Lease{}, opError("acquire", key, r.Replica, err)
	}
	return m.call(key, r, func(b *memBook, l *Lease) {
		if free := l.Budget - l.Total; free >= least {
			l.Granted = bytes
			if free < bytes {
				l.Granted = free
			}
			l.Held += l.Granted
			l.Total += l.Granted
		}
	}), nil
}

// Renew implements Store.
func (m *Memory) Renew(ctx context.Context, key string, r Request) (Lease, error) {
	err := check(key, r)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return Lease{}, opError("renew", key, r.Replica, err)
	}
	return m.call(key, r, func(*memBook, *Lease) {}), nil
}

// Release implements Store.
func (m *Memory) Release(ctx context.Context, key string, r Request, bytes int64) (Lease, error) {
	err := checkRelease(key, r, bytes)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return Lease{}, opError("release", key, r.Replica, err)
	}
	return m.call(key, r, func(b *memBook, l *Lease) {
		l.Released = min(bytes, l.Held)
		l.Held -= l.Released
		l.Total -= l.Released
	}), nil
}

// DropResidual implements Store.
func (m *Memory) DropResidual(ctx context.Context, key string, r Request) (Lease, error) {
	err := check(key, r)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return Lease{}, opError("drop", key, r.Replica, err)
	}
	return m.call(key, r, func(b *memBook, l *Lease) {
		now := m.s.now()
		for replica, e := range b.leases {
			if replica != r.Replica && !now.Add(e.ttl/3).Before(e.expires) {
				l.Dropped += e.n
				delete(b.leases, replica)
			}
		}
		l.Total -= l.Dropped
		l.Residual = 0
	}), nil
}

// call runs one replica's call the way the script does: purge, announce,
// count, change (f edits the Lease from the counted standing), renew.
func (m *Memory) call(key string, r Request, f func(*memBook, *Lease)) Lease {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	full := m.prefix + key
	b := s.keys[full]
	if b == nil {
		b = &memBook{leases: map[string]memEntry{}, budgets: map[string]memEntry{}}
		s.keys[full] = b
	}
	b.purge(now)
	expires := now.Add(r.TTL)
	if r.Budget > 0 {
		b.budgets[r.Replica] = memEntry{n: r.Budget, expires: expires}
	}
	l := Lease{Held: b.leases[r.Replica].n, Total: b.total(), Budget: b.budget(), Residual: b.residual(now, r.Replica)}
	f(b, &l)
	if l.Held > 0 {
		b.leases[r.Replica] = memEntry{n: l.Held, holds: r.Holds, running: r.Running, ttl: r.TTL, expires: expires, keep: now.Add(max(r.TTL, r.Residual))}
		l.TTL = r.TTL
	} else {
		delete(b.leases, r.Replica)
	}
	l.LiveHolds, l.LiveRunning, l.Silent = b.fresh(now, r.Replica)
	if len(b.leases) == 0 && len(b.budgets) == 0 {
		delete(s.keys, full)
	}
	return l
}

// Leases implements Store.
func (m *Memory) Leases(ctx context.Context, key string) (Listing, error) {
	if key == "" {
		return Listing{}, opError("list", key, "", invalid("empty key"))
	}
	if err := ctx.Err(); err != nil {
		return Listing{}, opError("list", key, "", err)
	}
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.keys[m.prefix+key]
	if b == nil {
		return Listing{}, nil
	}
	now := s.now()
	b.purge(now)
	f := Listing{Budget: b.budget(), Total: b.total(), Residual: b.residual(now, "")}
	byReplica := map[string]*Holder{}
	holder := func(replica string) *Holder {
		h := byReplica[replica]
		if h == nil {
			h = &Holder{Replica: replica}
			byReplica[replica] = h
		}
		return h
	}
	for replica, e := range b.leases {
		h := holder(replica)
		h.Bytes, h.Holds, h.Keep = e.n, e.holds, max(e.expires.Sub(now), e.keep.Sub(now))
		if h.Residual = e.residual(now); !h.Residual {
			h.TTL = e.expires.Sub(now)
		}
	}
	for replica, e := range b.budgets {
		holder(replica).Budget = e.n
	}
	for _, h := range byReplica {
		f.Holders = append(f.Holders, *h)
	}
	sortHolders(f.Holders)
	if len(b.leases) == 0 && len(b.budgets) == 0 {
		delete(s.keys, m.prefix+key)
	}
	return f, nil
}

func (b *memBook) purge(now time.Time) {
	for _, m := range []map[string]memEntry{b.leases, b.budgets} {
		for replica, e := range m {
			if e.gone(now) {
				delete(m, replica)
			}
		}
	}
}

// residual sums the residual holds of every replica but except.
func (b *memBook) residual(now time.Time, except string) int64 {
	var t int64
	for replica, e := range b.leases {
		if replica != except && e.residual(now) {
			t += e.n
		}
	}
	return t
}

// fresh sums, over every replica but except, the published holds (and
// requests) of those that called within half their TTL (fresh), and the
// leases of the others (silent).
func (b *memBook) fresh(now time.Time, except string) (holds, running, silent int64) {
	for replica, e := range b.leases {
		switch {
		case replica == except:
		case now.Add(e.ttl / 2).Before(e.expires):
			holds += e.holds
			running += e.running
		default:
			silent += e.n
		}
	}
	return holds, running, silent
}

func (b *memBook) total() int64 {
	var t int64
	for _, e := range b.leases {
		t += e.n
	}
	return t
}

// budget is the smallest live announcement, 0 without any.
func (b *memBook) budget() int64 {
	var least int64
	for _, e := range b.budgets {
		if least == 0 || e.n < least {
			least = e.n
		}
	}
	return least
}
