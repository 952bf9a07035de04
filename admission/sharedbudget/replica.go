package sharedbudget

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
)

// Scheduler is what the fleet reads from and sets on the local admission
// scheduler (an *admission.Scheduler): each pool's demand, its head
// request, what its requests may hold now, its limit and the forecast's
// margin, its tenants' holds and what the other replicas hold for them,
// and the learned output lengths of each model.
type Scheduler interface {
	Demand(pool string) (held, queued int64)
	Head(pool string) (charge int64, waited time.Duration)
	Holding(pool string) (bytes int64, tickets int)
	TenantHolds(pool string) map[string]admission.TenantLoad
	SetTenantsElsewhere(pool string, others map[string]admission.TenantLoad) error
	SetLimitUntil(pool string, limit int64, until time.Time) error
	SetMargin(pool string, scale float64) error
	LengthsDelta(queue string) (d admission.LengthsDelta, ok bool, err error)
	MergeLengths(queue string, d admission.LengthsDelta) error
}

var _ Scheduler = (*admission.Scheduler)(nil)

// Deps is what the fleet takes from the process that runs it.
type Deps struct {
	// Clock times the lessees, the fair-share and lengths loops and the
	// round trips. Default: admission.SystemClock().
	Clock  admission.Clock
	Logger *slog.Logger // default: slog.Default()
	// FallbackGrace is the longest a request may keep its reservation (the
	// gateway's request timeout): see LesseeConfig.FallbackGrace.
	FallbackGrace time.Duration
	// Observe, if set, is called after every round trip to Redis with its
	// operation (acquire, renew, release, drop, list, demand, lengths), how long
	// it took and its error: the hook for a latency histogram. It runs on
	// the caller's goroutine and must be quick.
	Observe func(op string, took time.Duration, err error)
}

// GPU is one GPU's budget as the gateway derives it now.
type GPU struct {
	Name    string // its budget key in Redis: the same on every replica
	ID      string // its admission pool
	Nominal int64  // the configured budget, which the chunk is a part of
	Budget  int64  // the derived budget: min(configured, the backends' reported pool)
}

// Replica is this gateway's part in a fleet of replicas that share each
// GPU's budget through Redis (see doc.go). Per admission pool (one per
// GPU) a Lessee holds this replica's lease on the GPU's budget and sets it
// as the pool's limit; the scheduler starts every pool at limit 0
// (admission.Config.Limited), so nothing is admitted before the lease is
// known, and wakes the lessee (admission.Config.OnDemand: Wake) when a
// request queues for lack of room or weight is given back. The budget a
// lessee announces is the pool's derived budget, kept current by SetBudget
// and Sync. A fair-share loop keeps saturated replicas at even parts of the
// budget (fair.go), and a lengthSharer exchanges the learned output
// lengths (lengths.go).
//
// Locking: mu serialises Sync and Close (which the gateway runs under its
// reload lock anyway) and guards lessees; byPool is a copy-on-write
// snapshot of it that the request path (Wake) reads without a lock.
type Replica struct {
	cfg      *Config
	log      *slog.Logger
	clock    admission.Clock
	grace    time.Duration // FallbackGrace: the request timeout
	residual time.Duration // how long a silent replica's lease counts (Config.ResidualTTL resolved)
	client   *redis.Client
	store    *Redis
	observe  func(op string, took time.Duration, err error) // never nil

	sched   Scheduler // set once by Start
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

	bg     context.Context // cancelled by Close and Abandon: every goroutine of the fleet stops
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
	l        *Lessee
	budget   atomic.Int64          // the budget last passed to SetBudget
	trust    atomic.Pointer[trust] // the lessee's last OnTrust; nil: none yet (capacity 0)
	level    atomic.Int64          // the fair level (fair.go); < 0: none
	recent   [demandWindow]int64   // the last demands posted (the fair-share loop's own)
	recentAt int
	margin   float64                   // the forecast margin last set (the fair-share loop's own; 0: never)
	turn     string                    // whose big request has a turn on the GPU, as last read (the fair-share loop's own)
	list     atomic.Pointer[fleetList] // the fleet as last listed, for /status
	listing  atomic.Bool               // a list is being read
	applyMu  sync.Mutex
	evMu     sync.Mutex // serialises Observe's reports of the GPU
	ev       Evidence   // under evMu
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
func (pl *poolLease) apply(sched Scheduler) {
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
func (pl *poolLease) demand(sched Scheduler) (held, queued int64) {
	held, queued = sched.Demand(pl.pool)
	if lv := pl.level.Load(); lv >= 0 {
		queued = min(queued, max(0, lv-held))
	}
	return held, queued
}

// New returns the fleet of a validated shared_budget section. It connects
// to Redis lazily (go-redis dials on first use), so a Redis that is down at
// start means a fallback, not a failure to start. Nothing runs before
// Start.
func New(cfg *Config, d Deps) *Replica {
	if d.Clock == nil {
		d.Clock = admission.SystemClock()
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.Observe == nil {
		d.Observe = func(string, time.Duration, error) {}
	}
	client := redis.NewClient(cfg.redisOpts)
	f := &Replica{
		cfg: cfg, log: d.Logger.With("replica", cfg.Replica), clock: d.Clock, grace: d.FallbackGrace, residual: cfg.residual(d.FallbackGrace),
		client: client, observe: d.Observe, lessees: map[string]*poolLease{}, draining: map[string]*poolLease{},
	}
	f.store = NewRedis(client, RedisOptions{Prefix: cfg.KeyPrefix, Observe: d.Observe, Now: d.Clock.Now})
	f.byPool.Store(&map[string]*poolLease{})
	f.bg, f.stopBG = context.WithCancel(context.Background())
	return f
}

// Start binds the fleet to the scheduler, starts sharing learned lengths
// (models lists the gateway's current models) and fair shares, and leases
// for gpus (see Sync). On an error, Close the fleet.
func (f *Replica) Start(sched Scheduler, models func() []string, gpus []GPU) error {
	f.sched = sched
	f.lengths = newLengthSharer(f.client, sched, f.cfg.KeyPrefix, f.cfg.Replica, models, f.observe, f.log, f.clock.Now)
	// The fleet's learned lengths, before anything is admitted: a replica
	// that (re)starts predicts from them at once rather than holding its
	// first requests at their worst case. Redis down: it warms up alone.
	ctx, cancel := context.WithTimeout(f.bg, f.cfg.LeaseTTL.D/3)
	if f.lengths.sync(ctx) == nil {
		f.lengths.logWarm()
	}
	cancel()
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		f.lengths.run(f.bg, f.clock, f.cfg.LengthsInterval.D)
	}()
	go func() {
		defer f.wg.Done()
		f.runFair(f.bg, f.cfg.LeaseTTL.D/6)
	}()
	if err := f.Sync(gpus); err != nil {
		return err
	}
	sb := f.cfg
	f.log.Info("sharing GPU budgets with the fleet through Redis", "replicas", sb.Replicas,
		"redis", redactURL(sb.Redis), "lease_ttl", sb.LeaseTTL.D, "residual_ttl", f.residual, "chunk", sb.Chunk.String())
	return nil
}

// Wake is the scheduler's OnDemand: it hurries the pool's lessee. It runs
// on a request's goroutine and never blocks.
func (f *Replica) Wake(pool string) {
	if pl := (*f.byPool.Load())[pool]; pl != nil {
		pl.l.Wake()
	}
}

// Sync makes the lessees match gpus: a lessee per pool, started for a new
// pool (closed at limit 0 until its lease comes), kept for a pool that
// stays (its budget updated), replaced for a pool whose GPU name — its key
// in Redis — changed, and shut down for a pool that is gone — once what
// runs on its GPU has ended (draining), or taken back if it returns first.
func (f *Replica) Sync(gpus []GPU) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	want := map[string]*GPU{}
	for i := range gpus {
		want[gpus[i].ID] = &gpus[i]
	}
	for pool, pl := range f.lessees {
		if g := want[pool]; g == nil || g.Name != pl.gpu {
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
		budget := g.Budget
		if pl := f.lessees[pool]; pl != nil {
			pl.setBudget(budget)
			continue
		}
		f.drainMu.Lock()
		pl := f.draining[pool]
		if pl != nil && pl.gpu == g.Name {
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

func (f *Replica) startLocked(g *GPU, budget int64) (*poolLease, error) {
	pl := &poolLease{gpu: g.Name, pool: g.ID, chunk: f.cfg.Chunk.Of(g.Nominal), done: make(chan struct{})}
	pl.level.Store(-1)
	sched := f.sched
	l, err := NewLessee(LesseeConfig{
		Store: f.store, Key: g.Name, Replica: f.cfg.Replica, Replicas: f.cfg.Replicas,
		Budget: budget, Chunk: pl.chunk, TTL: f.cfg.LeaseTTL.D, FallbackGrace: f.grace, Residual: f.residual,
		Demand: func() (int64, int64) { return pl.demand(sched) },
		Holds:  func() (int64, int) { return sched.Holding(pl.pool) },
		OnTrust: func(c int64, until time.Time) {
			pl.trust.Store(&trust{capacity: c, until: until})
			pl.apply(sched)
		},
		Clock:  f.clock,
		Logger: f.log.With("gpu", g.Name),
	})
	if err != nil {
		return nil, fmt.Errorf("shared_budget: gpu %q: %w", g.Name, err)
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

// Observe takes a report of the backends of pool's GPU (see Report): once
// EvidenceReports of them in a row show the GPU's use covered by the fresh
// replicas' holds while another replica is silent, the lessee ends the
// silent replicas' leases (Lessee.DropResidual), unless residual_release
// is timer. It runs on the caller's goroutine and never blocks.
func (f *Replica) Observe(pool string, r Report) {
	if f.cfg.ResidualRelease == ReleaseTimer {
		return
	}
	pl := (*f.byPool.Load())[pool]
	if pl == nil {
		return
	}
	pl.evMu.Lock()
	release := pl.ev.Observe(r, pl.l.Stats())
	pl.evMu.Unlock()
	if release {
		pl.l.DropResidual()
	}
}

// SetBudget says that pool's derived budget is now b (the backends
// reported a KV pool smaller than configured, or back to it).
func (f *Replica) SetBudget(pool string, b int64) {
	if pl := (*f.byPool.Load())[pool]; pl != nil {
		pl.setBudget(b)
	}
}

// stopLocked stops pl's goroutine and, with giveBack, returns what its pool
// does not hold (what it holds stays counted as a residual hold until the
// residual bound, by when those requests have ended).
func (f *Replica) stopLocked(pl *poolLease, giveBack bool) {
	pl.stop()
	<-pl.done
	if !giveBack {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.cfg.LeaseTTL.D)
	defer cancel()
	f.leaveBoard(ctx, pl)
	if err := pl.l.Shutdown(ctx); err != nil {
		f.log.Warn("giving the lease back failed; it counts until its residual bound", "gpu", pl.gpu, "err", err, "residual_ttl", f.residual)
	}
}

// reapDrained stops the lessees of removed pools whose requests have all
// ended, giving their leases back. The fair-share loop calls it.
func (f *Replica) reapDrained() {
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

// Close ends the fleet after the server drained: a last exchange of
// learned lengths, every lease given back, the connection closed.
func (f *Replica) Close() {
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

// Abandon stops the fleet as kill -9 would, as far as the other replicas
// can tell: its lessees stop renewing and give nothing back, so that what
// it leased becomes a residual hold after the TTL and goes after the
// residual bound. Tests use it to play a crash or a pause; Close is
// the way out of a running process.
func (f *Replica) Abandon() {
	f.mu.Lock()
	f.closed = true
	for _, pl := range f.lessees {
		pl.stop()
		<-pl.done
	}
	f.mu.Unlock()
	f.stopBG()
	f.wg.Wait()
}

// LeaseStatus is one GPU's lease as /status and the metrics show it.
type LeaseStatus struct {
	pl    *poolLease
	GPU   string
	ID    string
	Stats Stats
	Level int64 // the fair level; < 0: none
}

// Leases lists the lessees' stats, in no order.
func (f *Replica) Leases() []LeaseStatus {
	var out []LeaseStatus
	for _, pl := range *f.byPool.Load() {
		out = append(out, LeaseStatus{pl: pl, GPU: pl.gpu, ID: pl.pool, Stats: pl.l.Stats(), Level: pl.level.Load()})
	}
	return out
}

// Usable says whether some GPU can admit, or will once it has demand: a
// replica serving a fallback with no capacity (Redis never reached, or lost
// while it held nothing) admits nothing there until Redis answers or the
// fallback grace passes, and readiness says so, so that traffic goes to
// replicas that can serve it. An idle replica that reaches Redis holds no
// lease and is usable: it leases when requests come.
func (f *Replica) Usable() bool {
	sts := f.Leases()
	for _, ls := range sts {
		if !ls.Stats.Fallback || ls.Stats.Capacity > 0 {
			return true
		}
	}
	return len(sts) == 0
}

// holders reads the fleet view of gpu from Redis: every replica's lease.
func (f *Replica) holders(ctx context.Context, gpu string) (Listing, error) {
	return f.store.Leases(ctx, gpu)
}
