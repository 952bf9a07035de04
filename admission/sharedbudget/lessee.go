package sharedbudget

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// LesseeConfig configures a Lessee. Durations and sizes say their default;
// fields without one are required.
type LesseeConfig struct {
	Store   Store  // where the leases live
	Key     string // the GPU's budget key
	Replica string // this gateway process: unique in the fleet, stable while it runs
	// Replicas is the fleet size: while the store is unreachable a replica
	// admits at most budget / Replicas (its static share). At least 1.
	Replicas int
	// Budget is the GPU's budget in bytes as this replica derives it;
	// SetBudget changes it. 0: not known yet (nothing is leased until it is).
	Budget int64
	// Chunk is the unit in which the lease grows and is given back, in
	// bytes; more than 0. See doc.go for how it trades waste against round
	// trips.
	Chunk int64
	// TTL is the lease's time to live without renewal: a replica that dies
	// gives its lease back after it. Renewal runs every TTL/3. Default 3s;
	// at least 30ms.
	TTL time.Duration
	// Hysteresis is how long a whole chunk must stay idle before it is
	// given back, so that a dip in demand does not cost two round trips.
	// Default 1s; 0 is not allowed (use 1ns to return at once).
	Hysteresis time.Duration
	// Retry is how long to wait after a refused grant or a failed call
	// before asking again. Default TTL/10; at most TTL/3, so that when the
	// store returns every replica re-leases what it holds within the window
	// in which the others hold back (see doc.go).
	Retry time.Duration
	// FallbackGrace is, in a store outage, how long weight admitted above a
	// static share may stay held: the longest a request may keep its
	// reservation (the gateway's request timeout). A replica that has lost
	// the store for TTL + FallbackGrace admits up to its whole static share.
	// 0: never; until the store returns a replica keeps the smaller of what
	// it had leased and its share.
	FallbackGrace time.Duration
	// Residual is how long after its last call the lease still counts in
	// the store if this replica stops calling (paused, cut off, dead): by
	// then whatever its pool admitted on the lease has ended (see doc.go,
	// "Residual holds"). Default TTL: the lease ends with its TTL, for a
	// pool whose requests cannot outlive its process's calls. At least
	// TTL.
	Residual time.Duration
	// Demand reads the local admission pool: the weight it holds (admitted,
	// not yet released) and the weight queued for lack of capacity. It must
	// reflect every admission made under a capacity reported before the
	// call (read it under the pool's lock). Called from the goroutine that
	// steps the lessee, never on a request's path.
	Demand func() (held, queued int64)
	// Holds, if set, reads what the requests the pool admitted may hold on
	// the GPU now, a bound that cannot be below the truth (the guard's
	// now), and how many they are; every call publishes them with the
	// lease, so that the other replicas can tell from the backend's figures
	// whether this one's requests still run should it fall silent
	// (DropResidual). Called from the lessee's goroutine. nil: the held
	// weight of Demand, and no count.
	Holds func() (bytes int64, requests int)
	// OnCapacity tells the pool the most it may hold from now on. The pool
	// applies it before returning and never revokes what it holds; it only
	// stops admitting past the new capacity. The pool starts at 0.
	OnCapacity func(capacity int64)
	// OnTrust, if set, is called instead of OnCapacity, with the capacity's
	// horizon: from until on (by Clock) the pool must admit nothing new on
	// it until the next call, because the lease it comes from may have
	// expired in the store by then (see doc.go, "Renewal"). The pool checks
	// the horizon where it admits, so that a replica that was paused cannot
	// admit on a stale lease before this lessee has run again. It is called
	// whenever the capacity or its horizon changes (every renewal). A zero
	// until is no horizon: the static share of a fallback, or nothing.
	OnTrust func(capacity int64, until time.Time)
	Clock   admission.Clock // default: the system clock
	Logger  *slog.Logger    // default: slog.Default()
}

// Lessee holds one replica's lease on one GPU's budget and turns it into the
// local pool's capacity. See doc.go for the model and its invariants.
//
// Locking: Step (and Run, which calls it) must run on one goroutine at a
// time; the fields below statsMu belong to it and need no lock. SetBudget
// and Wake are safe from any goroutine and never block. Stats takes statsMu.
type Lessee struct {
	cfg   LesseeConfig
	log   *slog.Logger
	hb    time.Duration // renewal period: TTL/3
	alive atomic.Int64  // the budget, set by SetBudget
	wake  chan struct{}
	drop  atomic.Bool // DropResidual was asked for and not yet made

	granted     int64     // this replica's lease, as the store last said
	fleet       int64     // all leases on the key (residual holds included), at the last call
	residual    int64     // the other replicas' residual holds, at the last call
	others      int64     // the other fresh replicas' published holds, at the last call
	silent      int64     // the other replicas' leases that are not fresh, at the last call
	othersRun   int64     // the other fresh replicas' published requests, at the last call
	effective   int64     // the key's budget (smallest announced), at the last call
	capacity    int64     // last reported to the pool
	until       time.Time // the horizon last reported with it (OnTrust)
	contacted   bool      // a call has succeeded since the start
	lastSent    time.Time // when the last successful call was sent
	failing     bool      // the last call failed
	failSince   time.Time // when the current run of failures began
	retryAt     time.Time // no call before this while failing
	fallback    bool      // serving on the static share
	fallbackCap int64     // capacity on entering the fallback (≤ share)
	growAt      time.Time // from then on the fallback may use the whole share
	rejoinUntil time.Time // no growth before this after a fallback or a lost lease
	rejoinCap   int64     // capacity bound until rejoinUntil
	deniedUntil time.Time // no grant asked before this after a refusal
	idleSince   time.Time // since when a whole chunk has been idle; zero if none

	statsMu sync.Mutex // guards stats
	stats   Stats
}

// Stats is what a Lessee exposes to metrics and /status.
type Stats struct {
	Capacity    int64 // what the pool may hold now
	Leased      int64 // this replica's lease, as the store last said
	FleetLeased int64 // all leases on the key, residual holds included, at the last call
	// Residual is the other replicas' residual holds at the last call:
	// leases past their TTL that still count, because what those replicas
	// admitted may still run (see doc.go). Nobody may lease them.
	Residual int64
	// OthersHold is what the other fresh replicas published that their
	// requests may hold (their Holds), and OthersRunning how many they are,
	// at the last call; Silent the leases of the others, which missed a
	// renewal (Lease.Silent).
	OthersHold, OthersRunning, Silent int64
	Budget                            int64 // the key's budget at the last call (smallest announced)
	Share                             int64 // the static share used in a store outage
	Fallback                          bool  // serving on the static share: the store is unreachable
	Rejoining                         bool  // back from an outage or a lost lease: re-leasing before growing

	Grants     uint64 // acquires that granted something
	Denials    uint64 // acquires that granted nothing
	Releases   uint64 // chunks' worth of returns (calls)
	Renewals   uint64 // heartbeats that succeeded
	Failures   uint64 // calls that failed
	LostLeases uint64 // times the store held less for us than we counted
	// ResidualDrops counts the DropResidual calls that ended a residual
	// hold, and ResidualDropped the bytes they ended.
	ResidualDrops   uint64
	ResidualDropped int64
	LastError       error // the last failure, nil once a call succeeds again
}

// NewLessee checks cfg, fills its defaults, and returns a lessee holding
// nothing. Run it (or Step it) to lease.
func NewLessee(cfg LesseeConfig) (*Lessee, error) {
	if cfg.TTL == 0 {
		cfg.TTL = 3 * time.Second
	}
	if cfg.Hysteresis == 0 {
		cfg.Hysteresis = time.Second
	}
	if cfg.Retry == 0 {
		cfg.Retry = cfg.TTL / 10
	}
	if cfg.Residual == 0 {
		cfg.Residual = cfg.TTL
	}
	if cfg.Clock == nil {
		cfg.Clock = admission.SystemClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var err error
	switch {
	case cfg.Store == nil:
		err = errors.New("Store is required")
	case cfg.Key == "":
		err = errors.New("Key is required")
	case cfg.Replica == "":
		err = errors.New("Replica is required")
	case cfg.Replicas < 1:
		err = fmt.Errorf("Replicas %d: at least 1", cfg.Replicas)
	case cfg.Budget < 0 || cfg.Budget > MaxBytes:
		err = fmt.Errorf("Budget %d outside [0, %d]", cfg.Budget, int64(MaxBytes))
	case cfg.Chunk < 1 || cfg.Chunk > MaxBytes:
		err = fmt.Errorf("Chunk %d outside [1, %d]", cfg.Chunk, int64(MaxBytes))
	case cfg.TTL < 30*time.Millisecond:
		err = fmt.Errorf("TTL %v below 30ms", cfg.TTL)
	case cfg.Hysteresis < 0:
		err = fmt.Errorf("Hysteresis %v is negative", cfg.Hysteresis)
	case cfg.Retry < 0 || cfg.Retry > cfg.TTL/3:
		err = fmt.Errorf("Retry %v outside (0, TTL/3 = %v]", cfg.Retry, cfg.TTL/3)
	case cfg.FallbackGrace < 0:
		err = fmt.Errorf("FallbackGrace %v is negative", cfg.FallbackGrace)
	case cfg.Residual < cfg.TTL:
		err = fmt.Errorf("Residual %v below TTL %v", cfg.Residual, cfg.TTL)
	case cfg.Demand == nil:
		err = errors.New("Demand is required")
	case cfg.OnCapacity == nil && cfg.OnTrust == nil:
		err = errors.New("OnCapacity or OnTrust is required")
	}
	if err != nil {
		return nil, fmt.Errorf("leases: lessee for %q: %w", cfg.Key, err)
	}
	l := &Lessee{
		cfg:  cfg,
		log:  cfg.Logger.With("key", cfg.Key, "replica", cfg.Replica),
		hb:   cfg.TTL / 3,
		wake: make(chan struct{}, 1),
	}
	l.alive.Store(cfg.Budget)
	l.publish()
	return l, nil
}

// SetBudget changes the budget this replica derives for the GPU. A lower
// budget lowers the capacity at the next step; every budget is announced
// to the store at the next call.
func (l *Lessee) SetBudget(b int64) {
	l.alive.Store(max(0, min(b, MaxBytes)))
	l.Wake()
}

// Wake asks for a step soon: the pool calls it when its demand changed
// (something queued for lack of capacity, something released). It never
// blocks and costs one non-blocking channel send.
func (l *Lessee) Wake() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// DropResidual asks for the silent replicas' leases past their trust
// horizon (residual holds among them) to be ended at the next step (soon:
// it wakes the lessee), because the backend's figures show that what runs
// on the GPU is covered by the fresh replicas' own (see doc.go, "Residual
// holds"). A lease whose replica has called again by then stays. It never
// blocks.
func (l *Lessee) DropResidual() {
	l.drop.Store(true)
	l.Wake()
}

// Stats is a snapshot as of the last step.
func (l *Lessee) Stats() Stats {
	l.statsMu.Lock()
	defer l.statsMu.Unlock()
	return l.stats
}

// Run steps the lessee whenever something is due or Wake is called, until
// ctx is done. It does not give the lease back: call Shutdown after it
// returns.
func (l *Lessee) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		next := l.Step(ctx)
		fired := make(chan struct{})
		t := l.cfg.Clock.AfterFunc(next.Sub(l.cfg.Clock.Now()), func() { close(fired) })
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-l.wake:
		case <-fired:
		}
		t.Stop()
	}
	return ctx.Err()
}

// Shutdown sets the capacity to 0 and gives back what the pool does not
// hold; what it still holds stays leased, and past the TTL counts as a
// residual hold until the residual bound, by when those requests have
// ended. Call it after Run returned.
func (l *Lessee) Shutdown(ctx context.Context) error {
	l.setCapacity(0)
	held, _ := l.cfg.Demand()
	var err error
	if r := l.granted - max(held, 0); r > 0 && !l.fallback {
		if !l.call(ctx, "release", r, 0) {
			err = l.Stats().LastError
		}
	}
	l.publish()
	return err
}

// Step does what is due now — renew, grow, re-lease, give back — then
// sets the capacity, and says when it next has something to do (Wake may
// call for a step sooner). Tests call it directly with a manual clock.
func (l *Lessee) Step(ctx context.Context) time.Time {
	if !l.failing || !l.now().Before(l.retryAt) {
		l.talk(ctx)
	}
	now := l.now()
	l.apply(now)
	l.publish()
	return l.next(now)
}

func (l *Lessee) now() time.Time { return l.cfg.Clock.Now() }

// talk makes the calls that are due, in order: the heartbeat (which also
// retries after a failure), then growth (or, while rejoining, the re-lease
// of what the pool holds), then the return of idle chunks.
func (l *Lessee) talk(ctx context.Context) {
	now := l.now()
	if !l.contacted || l.failing || !now.Before(l.lastSent.Add(l.hb)) {
		if !l.call(ctx, "renew", 0, 0) {
			return
		}
	}
	if l.drop.Swap(false) && l.silent > 0 {
		if !l.call(ctx, "drop", 0, 0) {
			return
		}
	}
	held, queued := l.cfg.Demand()
	budget := l.alive.Load()
	now = l.now()
	switch want := min(held+queued, budget) - l.granted; {
	case now.Before(l.deniedUntil):
	case now.Before(l.rejoinUntil):
		// Back from an outage: lease what the pool holds before admitting
		// more, and hold back growth until every replica has had time to
		// do the same.
		if need := held - l.granted; need > 0 {
			if !l.call(ctx, "acquire", need, need) {
				return
			}
		}
	case want > 0:
		ask := min((want+l.cfg.Chunk-1)/l.cfg.Chunk*l.cfg.Chunk, budget-l.granted)
		if !l.call(ctx, "acquire", ask, 1) {
			return
		}
	}
	l.giveBack(ctx)
}

// giveBack returns whole chunks that have stayed idle for the hysteresis.
// The pool never revokes what it holds, so it is told to stop admitting
// into them first, and only what it does not hold after that goes back.
func (l *Lessee) giveBack(ctx context.Context) {
	held, queued := l.cfg.Demand()
	idle := l.granted - (held + queued)
	if idle < l.cfg.Chunk {
		l.idleSince = time.Time{}
		return
	}
	now := l.now()
	if l.idleSince.IsZero() {
		l.idleSince = now
		return
	}
	if now.Sub(l.idleSince) < l.cfg.Hysteresis {
		return
	}
	keep := l.granted - idle/l.cfg.Chunk*l.cfg.Chunk
	l.setCapacity(min(l.capacity, keep))
	held, _ = l.cfg.Demand()
	if r := l.granted - max(keep, held); r > 0 {
		l.call(ctx, "release", r, 0)
	}
	l.idleSince = time.Time{}
}

// call makes one store call and books its answer; false if it failed.
func (l *Lessee) call(ctx context.Context, op string, bytes, least int64) bool {
	sent := l.now()
	timeout := l.hb
	if left := l.fallbackAt().Sub(sent); l.contacted && !l.fallback && left > 0 {
		// A hung call must not carry a trusted lease past fallbackAt.
		// Past it (a paused process), OnTrust's horizon has ended the
		// trust already; a cut call could only fail the renewal.
		timeout = min(timeout, left)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	r := Request{Replica: l.cfg.Replica, Budget: l.alive.Load(), TTL: l.cfg.TTL, Residual: l.cfg.Residual}
	r.Holds, r.Running = l.holds()
	var got Lease
	var err error
	switch op {
	case "renew":
		got, err = l.cfg.Store.Renew(cctx, l.cfg.Key, r)
	case "acquire":
		got, err = l.cfg.Store.Acquire(cctx, l.cfg.Key, r, bytes, least)
	case "release":
		got, err = l.cfg.Store.Release(cctx, l.cfg.Key, r, bytes)
	case "drop":
		got, err = l.cfg.Store.DropResidual(cctx, l.cfg.Key, r)
	}
	cancel()
	now := l.now()
	if err != nil {
		l.failed(now, err)
		return false
	}
	l.answered(sent, now, op, bytes, got)
	return true
}

// holds is what this replica publishes that its requests may hold, and
// how many they are.
func (l *Lessee) holds() (int64, int64) {
	if l.cfg.Holds != nil {
		b, n := l.cfg.Holds()
		return max(0, min(b, MaxBytes)), int64(max(0, n))
	}
	held, _ := l.cfg.Demand()
	return max(0, min(held, MaxBytes)), 0
}

func (l *Lessee) failed(now time.Time, err error) {
	l.count(func(s *Stats) { s.Failures++; s.LastError = err })
	if !l.failing {
		l.failing, l.failSince = true, now
		l.log.Warn("lease store call failed; retrying", "err", err, "leased", l.granted)
	}
	l.retryAt = now.Add(l.cfg.Retry)
}

func (l *Lessee) answered(sent, now time.Time, op string, asked int64, got Lease) {
	expected := l.granted + got.Granted - got.Released
	l.contacted, l.lastSent = true, sent
	l.count(func(s *Stats) {
		s.LastError = nil
		switch {
		case op == "renew":
			s.Renewals++
		case op == "release":
			s.Releases++
		case op == "drop":
			if got.Dropped > 0 {
				s.ResidualDrops++
				s.ResidualDropped += got.Dropped
			}
		case got.Granted > 0:
			s.Grants++
		default:
			s.Denials++
		}
	})
	if l.failing {
		l.failing = false
		l.log.Info("lease store reachable again", "leased", got.Held, "fallback", l.fallback)
	}
	if l.fallback || got.Held < expected {
		if !l.fallback {
			l.count(func(s *Stats) { s.LostLeases++ })
			l.log.Warn("lease lost: the store holds less than this replica counted; re-leasing what the pool holds",
				"counted", expected, "held", got.Held)
		}
		l.fallback = false
		l.rejoinUntil = now.Add(l.cfg.TTL)
		l.rejoinCap = l.capacity
	}
	l.granted, l.fleet, l.effective, l.residual, l.others, l.silent = got.Held, got.Total, got.Budget, got.Residual, got.LiveHolds, got.Silent
	l.othersRun = got.LiveRunning
	if got.Dropped > 0 {
		l.log.Info("ended the residual holds of silent replicas: the backend's figures are covered by the live replicas' own, so their requests are gone",
			"dropped", got.Dropped)
	}
	if op == "acquire" && got.Granted < asked {
		l.deniedUntil = now.Add(l.cfg.Retry)
	}
}

// fallbackAt is when the lease stops being trusted without a renewal: a
// third of the TTL before the store may expire it, which leaves room for a
// late timer. Before any success it is the zero time: nothing is trusted.
func (l *Lessee) fallbackAt() time.Time {
	if !l.contacted {
		return time.Time{}
	}
	return l.lastSent.Add(l.cfg.TTL - l.hb)
}

func (l *Lessee) share() int64 {
	b := l.alive.Load()
	if l.effective > 0 && l.effective < b {
		b = l.effective
	}
	return b / int64(l.cfg.Replicas)
}

// apply works out the capacity (see doc.go, "Capacity") and reports it.
func (l *Lessee) apply(now time.Time) {
	if !l.fallback && l.failing && !now.Before(l.fallbackAt()) {
		l.fallback = true
		l.fallbackCap = min(l.capacity, l.share())
		l.growAt = l.failSince.Add(l.cfg.TTL + l.cfg.FallbackGrace)
		l.idleSince = time.Time{}
		l.log.Warn("lease store unreachable: serving on a static share",
			"capacity", l.fallbackCap, "share", l.share(), "since", l.failSince)
	}
	var c int64
	if l.fallback {
		share := l.share()
		c = min(l.fallbackCap, share)
		if l.cfg.FallbackGrace > 0 && !now.Before(l.growAt) {
			c = share
		}
	} else {
		c = l.granted
		if now.Before(l.rejoinUntil) {
			c = min(c, l.rejoinCap)
		}
		if l.fleet > l.effective {
			// The budget was lowered under the leases: each replica uses
			// its part of the new budget until they fit again.
			c = scale(min(c, l.fleet), l.effective, l.fleet)
		}
	}
	l.setCapacity(max(0, min(c, l.alive.Load())))
}

// scale is c × num / den rounded down, for c ≤ den, without overflow.
func scale(c, num, den int64) int64 {
	hi, lo := bits.Mul64(uint64(c), uint64(num))
	q, _ := bits.Div64(hi, lo, uint64(den))
	return int64(q)
}

// setCapacity publishes the new state before the pool hears of it, so that
// whoever the change wakes reads Stats that agree with it.
func (l *Lessee) setCapacity(c int64) {
	var until time.Time
	if c > 0 && !l.fallback {
		until = l.fallbackAt()
	}
	changed := c != l.capacity
	if !changed && (l.cfg.OnTrust == nil || until.Equal(l.until)) {
		return
	}
	l.capacity, l.until = c, until
	l.publish()
	if l.cfg.OnTrust != nil {
		l.cfg.OnTrust(c, until)
	} else {
		l.cfg.OnCapacity(c)
	}
}

// next is the earliest time something falls due after now.
func (l *Lessee) next(now time.Time) time.Time {
	if !l.contacted && !l.failing {
		return now
	}
	t := now.Add(l.cfg.TTL)
	consider := func(x time.Time) {
		if x.After(now) && x.Before(t) {
			t = x
		}
	}
	if l.failing {
		consider(l.retryAt)
		if !l.fallback {
			consider(l.fallbackAt())
		}
	} else {
		consider(l.lastSent.Add(l.hb))
	}
	if l.fallback && l.cfg.FallbackGrace > 0 {
		consider(l.growAt)
	}
	consider(l.rejoinUntil)
	consider(l.deniedUntil)
	if !l.idleSince.IsZero() {
		consider(l.idleSince.Add(l.cfg.Hysteresis))
	}
	return t
}

func (l *Lessee) count(f func(*Stats)) {
	l.statsMu.Lock()
	defer l.statsMu.Unlock()
	f(&l.stats)
}

func (l *Lessee) publish() {
	l.count(func(s *Stats) {
		s.Capacity, s.Leased, s.FleetLeased, s.Budget, s.Residual, s.OthersHold, s.Silent = l.capacity, l.granted, l.fleet, l.effective, l.residual, l.others, l.silent
		s.OthersRunning = l.othersRun
		s.Share, s.Fallback = l.share(), l.fallback
		s.Rejoining = l.now().Before(l.rejoinUntil)
	})
}
