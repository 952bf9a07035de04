package sharedbudget_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/admission/sharedbudget"
)

// transcript collects what the store and the pool saw, in order.
type transcript struct {
	mu    sync.Mutex
	lines []string
}

func (tr *transcript) add(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lines = append(tr.lines, fmt.Sprintf(format, args...))
}

// take returns the lines since the last take.
func (tr *transcript) take() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	l := tr.lines
	tr.lines = nil
	return l
}

func (tr *transcript) expect(t *testing.T, what string, want ...string) {
	t.Helper()
	got := tr.take()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\ngot:\n\t%s\nwant:\n\t%s", what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// switchable is the store as the replica reaches it: it can go down (every
// call fails as with Redis unreachable) and be replaced by an empty one (a
// Redis restarted without persistence). It writes each call to a
// transcript when it has one.
type switchable struct {
	mu   sync.Mutex // guards below
	s    sharedbudget.Store
	down bool
	tr   *transcript
}

var _ sharedbudget.Store = (*switchable)(nil)

func (w *switchable) set(s sharedbudget.Store, down bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.s, w.down = s, down
}

func (w *switchable) get(op, key string) (sharedbudget.Store, *transcript, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.down {
		if w.tr != nil {
			w.tr.add("store: %s fails", op)
		}
		return nil, nil, fmt.Errorf("leases: %s on %q: %w: connection refused", op, key, sharedbudget.ErrUnavailable)
	}
	return w.s, w.tr, nil
}

func (w *switchable) Acquire(ctx context.Context, key string, r sharedbudget.Request, bytes, least int64) (sharedbudget.Lease, error) {
	s, tr, err := w.get("acquire", key)
	if err != nil {
		return sharedbudget.Lease{}, err
	}
	l, err := s.Acquire(ctx, key, r, bytes, least)
	if tr != nil {
		tr.add("store: acquire %d least %d -> granted %d, held %d", bytes, least, l.Granted, l.Held)
	}
	return l, err
}

func (w *switchable) Renew(ctx context.Context, key string, r sharedbudget.Request) (sharedbudget.Lease, error) {
	s, tr, err := w.get("renew", key)
	if err != nil {
		return sharedbudget.Lease{}, err
	}
	l, err := s.Renew(ctx, key, r)
	if tr != nil {
		tr.add("store: renew -> held %d", l.Held)
	}
	return l, err
}

func (w *switchable) Release(ctx context.Context, key string, r sharedbudget.Request, bytes int64) (sharedbudget.Lease, error) {
	s, tr, err := w.get("release", key)
	if err != nil {
		return sharedbudget.Lease{}, err
	}
	l, err := s.Release(ctx, key, r, bytes)
	if tr != nil {
		tr.add("store: release %d -> released %d, held %d", bytes, l.Released, l.Held)
	}
	return l, err
}

func (w *switchable) DropResidual(ctx context.Context, key string, r sharedbudget.Request) (sharedbudget.Lease, error) {
	s, tr, err := w.get("drop", key)
	if err != nil {
		return sharedbudget.Lease{}, err
	}
	l, err := s.DropResidual(ctx, key, r)
	if tr != nil {
		tr.add("store: drop -> dropped %d, held %d", l.Dropped, l.Held)
	}
	return l, err
}

func (w *switchable) Leases(ctx context.Context, key string) (sharedbudget.Listing, error) {
	s, _, err := w.get("list", key)
	if err != nil {
		return sharedbudget.Listing{}, err
	}
	return s.Leases(ctx, key)
}

// pool stands in for the admission pool: it admits while what it holds
// fits the capacity the lessee gave it, and never revokes.
type pool struct {
	mu       sync.Mutex // guards below
	capacity int64
	held     int64
	queued   int64
	tr       *transcript
	// onCapacity, if set, runs after a capacity change is applied, under
	// no lock: a test's way to admit at that very moment.
	onCapacity func()
}

func (p *pool) Demand() (held, queued int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held, p.queued
}

func (p *pool) OnCapacity(c int64) {
	p.mu.Lock()
	p.capacity = c
	if p.tr != nil {
		p.tr.add("pool: capacity %d", c)
	}
	hook := p.onCapacity
	p.mu.Unlock()
	if hook != nil {
		hook()
	}
}

// set makes the pool hold held and queue queued, as if requests had come
// and gone; it does not check the capacity (use admit for that).
func (p *pool) set(held, queued int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held, p.queued = held, queued
}

// admit takes w if it fits the capacity.
func (p *pool) admit(w int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held+w > p.capacity {
		return false
	}
	p.held += w
	return true
}

func (p *pool) release(w int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held -= w
}

func (p *pool) state() (capacity, held int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.capacity, p.held
}

// rig is one or more lessees on a manual clock, sharing a switchable
// in-process store.
type rig struct {
	t     *testing.T
	clock *admissiontest.Clock
	store *switchable
	tr    *transcript
	ctx   context.Context
}

var epoch = time.Unix(1_000_000, 0)

func newRig(t *testing.T) *rig {
	clock := admissiontest.NewClock(epoch)
	tr := &transcript{}
	return &rig{t: t, clock: clock, tr: tr, ctx: context.Background(),
		store: &switchable{s: sharedbudget.NewMemory(clock.Now), tr: tr}}
}

// lessee returns a lessee for replica on key "gpu0" with a pool of its own;
// edit changes the defaults first.
func (r *rig) lessee(replica string, edit func(*sharedbudget.LesseeConfig)) (*sharedbudget.Lessee, *pool) {
	p := &pool{tr: r.tr}
	cfg := sharedbudget.LesseeConfig{
		Store: r.store, Key: "gpu0", Replica: replica, Replicas: 2,
		Budget: 1000, Chunk: 100, TTL: 3 * time.Second, Hysteresis: time.Second, Retry: 300 * time.Millisecond,
		Demand: p.Demand, OnCapacity: p.OnCapacity, Clock: r.clock,
		Logger: slog.New(slog.DiscardHandler),
	}
	if edit != nil {
		edit(&cfg)
	}
	l, err := sharedbudget.NewLessee(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	return l, p
}

// drive steps the lessees the way Run would — each at the time its last
// step asked for — until d has passed on the clock; check runs after every
// step. It returns when the clock has moved d.
func (r *rig) drive(d time.Duration, check func(), ls ...*sharedbudget.Lessee) {
	end := r.clock.Now().Add(d)
	next := make([]time.Time, len(ls))
	for i := range ls {
		next[i] = r.clock.Now()
	}
	for {
		i := 0
		for j := range next {
			if next[j].Before(next[i]) {
				i = j
			}
		}
		if next[i].After(end) {
			r.clock.Advance(end.Sub(r.clock.Now()))
			return
		}
		if w := next[i].Sub(r.clock.Now()); w > 0 {
			r.clock.Advance(w)
		}
		next[i] = ls[i].Step(r.ctx)
		if !next[i].After(r.clock.Now()) {
			// Due at once (a first call): the next step is a nanosecond on,
			// so that the others get their turn.
			next[i] = r.clock.Now().Add(time.Nanosecond)
		}
		if check != nil {
			check()
		}
	}
}
