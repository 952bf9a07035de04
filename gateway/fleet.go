package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends/leases"
)

// fleet is this gateway's part in a fleet of replicas that share each
// GPU's budget through Redis (shared_budget). Per admission pool (one per
// GPU) a leases.Lessee holds this replica's lease on the GPU's budget and
// sets it as the pool's limit; the scheduler starts every pool at limit 0
// (admission.Config.Limited), so nothing is admitted before the lease is
// known, and wakes the lessee (admission.Config.OnDemand) when a request
// queues for lack of room or weight is given back. The budget a lessee
// announces is the pool's derived budget — min(configured, the backends'
// reported pool) — kept current by onKVReport and reloads. A fair-share
// loop keeps saturated replicas at even parts of the budget
// (fleet_fair.go), and a lengthSharer exchanges the learned output lengths
// (fleet_lengths.go).
//
// Locking: mu serialises sync and close (which run under the server's
// reloadMu anyway) and guards lessees; byPool is a copy-on-write snapshot
// of it that the request path (wake) reads without a lock.
type fleet struct {
	cfg    *SharedBudgetConfig
	log    *slog.Logger
	clock  admission.Clock
	grace  time.Duration // FallbackGrace: the request timeout
	client *redis.Client
	store  *leases.Redis
	rtt    *redisRTT

	sched   *admission.Scheduler // set once by attach
	lengths *lengthSharer

	mu      sync.Mutex
	lessees map[string]*poolLease // by admission pool name
	closed  bool
	byPool  atomic.Pointer[map[string]*poolLease]

	// draining holds the lessees of pools a reload removed while requests
	// still ran on their GPU: the lease covering those requests is renewed
	// until they end (reapDrained), or taken back if the pool returns.
	// Lock order: mu, then drainMu.
	drainMu  sync.Mutex
	draining map[string]*poolLease // by admission pool name

	bg     context.Context // cancelled by close/kill: every goroutine of the fleet stops
	stopBG context.CancelFunc
	wg     sync.WaitGroup // the lengths sharer and the fair-share loop
}

// poolLease is one pool's lessee and the goroutine that runs it. The
// pool's limit is min(capacity, level): applyMu orders the SetLimit calls
// of the lessee's goroutine and of the fair-share loop, so that the last
// one applied is computed from the latest of both.
type poolLease struct {
	gpu      string // its budget key in Redis: the GPU's name, the same on every replica
	pool     string
	chunk    int64 // the lessee's
	l        *leases.Lessee
	budget   atomic.Int64          // the budget last passed to SetBudget
	trust    atomic.Pointer[trust] // the lessee's last OnTrust; nil: none yet (capacity 0)
	level    atomic.Int64          // the fair level (fleet_fair.go); < 0: none
	recent   [demandWindow]int64   // the last demands posted (the fair-share loop's own)
	recentAt int
	margin   float64                   // the forecast margin last set (the fair-share loop's own; 0: never)
	list     atomic.Pointer[fleetList] // the fleet as last listed, for /status
	listing  atomic.Bool               // a list is being read
	applyMu  sync.Mutex
	stop     context.CancelFunc
	done     chan struct{}
}

// trust is a lessee's capacity and the horizon past which the pool must
// not admit on it (zero: none), set together so that a capacity is never
// applied with another's horizon.
type trust struct {
	capacity int64
	until    time.Time
}

// apply sets the pool's limit to min(capacity, level), trusted until the
// capacity's horizon: the scheduler checks it where it admits, so a replica
// that was paused admits nothing on its lease before the lessee confirms it.
func (pl *poolLease) apply(sched *admission.Scheduler) {
	pl.applyMu.Lock()
	defer pl.applyMu.Unlock()
	var tr trust
	if t := pl.trust.Load(); t != nil {
		tr = *t
	}
	c := tr.capacity
	if lv := pl.level.Load(); lv >= 0 {
		c = min(c, lv)
	}
	// A pool a reload removed is unknown to the scheduler: nothing to
	// limit any more.
	_ = sched.SetLimitUntil(pl.pool, c, tr.until)
}

// demand is what the lessee leases for: the pool's demand, its queued part
// cut at the fair level.
func (pl *poolLease) demand(sched *admission.Scheduler) (held, queued int64) {
	held, queued = sched.Demand(pl.pool)
	if lv := pl.level.Load(); lv >= 0 {
		queued = min(queued, max(0, lv-held))
	}
	return held, queued
}

// newFleet connects to Redis (lazily: go-redis dials on first use, so a
// Redis that is down at start means a fallback, not a failure to start).
func newFleet(cfg *SharedBudgetConfig, opt *Options, log *slog.Logger, requestTimeout time.Duration, rtt *redisRTT) *fleet {
	client := redis.NewClient(cfg.redisOpts)
	f := &fleet{
		cfg: cfg, log: log.With("replica", cfg.Replica), clock: opt.Clock, grace: requestTimeout,
		client: client, rtt: rtt, lessees: map[string]*poolLease{}, draining: map[string]*poolLease{},
	}
	if f.clock == nil {
		f.clock = admission.SystemClock()
	}
	f.store = leases.NewRedis(client, leases.RedisOptions{Prefix: cfg.KeyPrefix, Observe: rtt.observe})
	f.byPool.Store(&map[string]*poolLease{})
	f.bg, f.stopBG = context.WithCancel(context.Background())
	return f
}

// attach binds the fleet to the server's scheduler and starts sharing
// learned lengths; models lists the current runtime's models.
func (f *fleet) attach(sched *admission.Scheduler, models func() []string) {
	f.sched = sched
	f.lengths = newLengthSharer(f.client, sched, f.cfg.KeyPrefix, f.cfg.Replica, models, f.rtt.observe, f.log)
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		f.lengths.run(f.bg, f.cfg.LengthsInterval.D)
	}()
	go func() {
		defer f.wg.Done()
		f.runFair(f.bg, f.cfg.LeaseTTL.D/6)
	}()
}

// wake is the scheduler's OnDemand: it hurries the pool's lessee. It runs
// on a request's goroutine and never blocks.
func (f *fleet) wake(pool string) {
	if pl := (*f.byPool.Load())[pool]; pl != nil {
		pl.l.Wake()
	}
}

// sync makes the lessees match rt's GPUs: a lessee per pool, started for a
// new pool (closed at limit 0 until its lease comes), kept for a pool that
// stays (its budget updated), replaced for a pool whose GPU name — its key
// in Redis — changed, and shut down for a pool that is gone — once what
// runs on its GPU has ended (draining), or taken back if it returns first.
func (f *fleet) sync(rt *runtime) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	want := map[string]*group{}
	for _, g := range rt.groups {
		want[g.pool] = g
	}
	for pool, pl := range f.lessees {
		if g := want[pool]; g == nil || g.name != pl.gpu {
			delete(f.lessees, pool)
			if held, _ := f.sched.Demand(pool); held > 0 && g == nil {
				// Its GPU still runs what the pool admitted: giving the
				// lease back, or letting it expire, would let another
				// replica admit into memory in use.
				f.drainMu.Lock()
				f.draining[pool] = pl
				f.drainMu.Unlock()
				continue
			}
			f.stopLocked(pl, true)
		}
	}
	for pool, g := range want {
		budget := g.capacity(rt.count)
		if pl := f.lessees[pool]; pl != nil {
			pl.setBudget(budget)
			continue
		}
		f.drainMu.Lock()
		pl := f.draining[pool]
		if pl != nil && pl.gpu == g.name {
			delete(f.draining, pool) // back: its lease is the pool's again
			f.drainMu.Unlock()
			f.lessees[pool] = pl
			pl.setBudget(budget)
			pl.apply(f.sched)
			continue
		}
		f.drainMu.Unlock()
		pl, err := f.startLocked(g, budget)
		if err != nil {
			return err
		}
		f.lessees[pool] = pl
	}
	m := maps.Clone(f.lessees)
	f.byPool.Store(&m)
	return nil
}

func (f *fleet) startLocked(g *group, budget int64) (*poolLease, error) {
	pl := &poolLease{gpu: g.name, pool: g.pool, chunk: f.cfg.Chunk.of(g.nominal), done: make(chan struct{})}
	pl.level.Store(-1)
	sched := f.sched
	l, err := leases.NewLessee(leases.LesseeConfig{
		Store: f.store, Key: g.name, Replica: f.cfg.Replica, Replicas: f.cfg.Replicas,
		Budget: budget, Chunk: pl.chunk, TTL: f.cfg.LeaseTTL.D, FallbackGrace: f.grace,
		Demand: func() (int64, int64) { return pl.demand(sched) },
		OnTrust: func(c int64, until time.Time) {
			pl.trust.Store(&trust{capacity: c, until: until})
			pl.apply(sched)
		},
		Clock:  f.clock,
		Logger: f.log.With("gpu", g.name),
	})
	if err != nil {
		return nil, fmt.Errorf("shared_budget: gpu %q: %w", g.name, err)
	}
	pl.l = l
	pl.budget.Store(budget)
	ctx, cancel := context.WithCancel(f.bg)
	pl.stop = cancel
	go func() {
		defer close(pl.done)
		_ = l.Run(ctx)
	}()
	return pl, nil
}

// setBudget passes a changed budget on to the lessee.
func (pl *poolLease) setBudget(b int64) {
	if pl.budget.Swap(b) != b {
		pl.l.SetBudget(b)
	}
}

// setBudget is onKVReport's: pool's derived budget is now b.
func (f *fleet) setBudget(pool string, b int64) {
	if pl := (*f.byPool.Load())[pool]; pl != nil {
		pl.setBudget(b)
	}
}

// stopLocked stops pl's goroutine and, with giveBack, returns what its pool
// does not hold (what it holds expires with the TTL, by when those requests
// have finished or died with the process).
func (f *fleet) stopLocked(pl *poolLease, giveBack bool) {
	pl.stop()
	<-pl.done
	if !giveBack {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.cfg.LeaseTTL.D)
	defer cancel()
	f.leaveBoard(ctx, pl)
	if err := pl.l.Shutdown(ctx); err != nil {
		f.log.Warn("giving the lease back failed; it expires with its TTL", "gpu", pl.gpu, "err", err, "ttl", f.cfg.LeaseTTL.D)
	}
}

// reapDrained stops the lessees of removed pools whose requests have all
// ended, giving their leases back. The fair-share loop calls it.
func (f *fleet) reapDrained() {
	var done []*poolLease
	f.drainMu.Lock()
	for pool, pl := range f.draining {
		if held, _ := f.sched.Demand(pool); held == 0 {
			done = append(done, pl)
			delete(f.draining, pool)
		}
	}
	f.drainMu.Unlock()
	for _, pl := range done {
		f.stopLocked(pl, true) // touches pl alone: f.mu is not needed
	}
}

// close ends the fleet after the server drained: a last exchange of
// learned lengths, every lease given back, the connection closed.
func (f *fleet) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.closed = true
	f.stopBG() // the lessees' Run too
	f.wg.Wait()
	for _, pl := range f.lessees {
		f.stopLocked(pl, true)
	}
	f.drainMu.Lock()
	for pool, pl := range f.draining {
		f.stopLocked(pl, true)
		delete(f.draining, pool)
	}
	f.drainMu.Unlock()
	if f.lengths != nil {
		ctx, cancel := context.WithTimeout(context.Background(), f.cfg.LeaseTTL.D)
		_ = f.lengths.sync(ctx)
		cancel()
	}
	_ = f.client.Close()
}

// leaseStatus is one GPU's lease as /status and the metrics show it.
type leaseStatus struct {
	pl        *poolLease
	gpu, pool string
	stats     leases.Stats
	level     int64 // the fair level; < 0: none
}

// statuses lists the lessees' stats, by pool.
func (f *fleet) statuses() []leaseStatus {
	var out []leaseStatus
	for _, pl := range *f.byPool.Load() {
		out = append(out, leaseStatus{pl: pl, gpu: pl.gpu, pool: pl.pool, stats: pl.l.Stats(), level: pl.level.Load()})
	}
	return out
}

// usable says whether some GPU can admit, or will once it has demand: a
// replica serving a fallback with no capacity (Redis never reached, or lost
// while it held nothing) admits nothing there until Redis answers or the
// fallback grace passes, and readiness says so, so that traffic goes to
// replicas that can serve it. An idle replica that reaches Redis holds no
// lease and is usable: it leases when requests come.
func (f *fleet) usable() bool {
	sts := f.statuses()
	for _, ls := range sts {
		if !ls.stats.Fallback || ls.stats.Capacity > 0 {
			return true
		}
	}
	return len(sts) == 0
}

// holders reads the fleet view of gpu from Redis: every replica's lease.
func (f *fleet) holders(ctx context.Context, gpu string) (leases.Fleet, error) {
	return f.store.Leases(ctx, gpu)
}
