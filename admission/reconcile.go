package admission

import (
	"fmt"
	"time"
)

// Reconciliation: a GPU's backends report what they hold (KV usage × KV pool,
// running requests); the requests admitted there account for at most the
// GPU's now (what each ticket may hold at this moment: guard.go), and, in
// a fleet, for the other replicas' leases. What the backends hold beyond
// that is memory nobody admitted: a second client of the backend, another
// gateway, or a count that went wrong. It is as real as the admitted part,
// so while it lasts it comes off what the GPU may admit (SetUnaccounted).
//
// The accounted side is a bound that cannot be below the truth (now is what
// a ticket may hold, not what it is thought to hold), so the difference is
// never more than the memory nobody admitted, except for what moves between
// the backend's report and its reading: blocks freed by requests that ended
// since the backend counted (scrape lag), the block each running request
// may have taken in the step the report lags by, and the backend's own
// reserved block. A figure within Tolerance never counts, and Sustain keeps
// one from counting until it has lasted, so that a report that caught a
// release half-way never shrinks anything. What counts is the figure less
// the blocks the backend holds of its own (the reserved one and one per
// running request), not less the whole tolerance: a lasting figure is
// memory someone holds, and the closer the count is to it, the less the
// GPU overflows.

// ReconcileConfig tunes a Reconciler. Zero values take the defaults.
type ReconcileConfig struct {
	// Tolerance is the fraction of the GPU that unaccounted memory may
	// reach without counting (default DefaultReconcileTolerance); the
	// backend's reserved block and one block per running request come on
	// top of it.
	Tolerance float64
	// Sustain is how long a figure must last to count, and how long a
	// lower one must last to replace it (default DefaultReconcileSustain).
	Sustain time.Duration
}

// Defaults of ReconcileConfig.
const (
	DefaultReconcileTolerance = 0.03
	DefaultReconcileSustain   = 5 * time.Second
)

// Reading is one report of a GPU's backends, with what admission accounts
// for there when it is read. Bytes are of one GPU.
type Reading struct {
	At   time.Time
	Pool int64 // the backends' KV pool
	Used int64 // the part they report in use
	// Accounted is what the requests admitted to the GPU may hold now (a
	// bound: the GPU's Now, plus in a fleet the other replicas' leases).
	Accounted int64
	// Running is how many requests the backends report running;
	// BlockBytes the size of one of their KV blocks.
	Running    int
	BlockBytes int64
}

// Reconciled is what a Reading makes of a GPU.
type Reconciled struct {
	// Observed is this reading's Used − Accounted (0 if negative), before
	// the tolerance.
	Observed int64
	// Tolerance is what Observed may reach without counting.
	Tolerance int64
	// Unaccounted is the figure in force, less the backend's own blocks
	// (its reserved one and one per running request): it rises to a level
	// Observed has stayed at or above, past the tolerance, for a whole
	// Sustain, and falls to one it has stayed at or below for as long. It
	// is what comes off the GPU's limit.
	Unaccounted int64
}

// Reconciler follows one GPU's unaccounted memory over its readings. It is
// a value with no clock and no lock: time comes with each Reading, and its
// caller serialises Observe.
type Reconciler struct {
	cfg     ReconcileConfig
	samples []reconSample // oldest first; the ones Observe still needs
	last    Reconciled
}

type reconSample struct {
	at time.Time
	u  int64 // Observed less the backend's own blocks when above the tolerance, else 0
}

// NewReconciler returns a Reconciler with cfg's defaults filled in.
func NewReconciler(cfg ReconcileConfig) (*Reconciler, error) {
	if cfg.Tolerance == 0 {
		cfg.Tolerance = DefaultReconcileTolerance
	}
	if cfg.Sustain == 0 {
		cfg.Sustain = DefaultReconcileSustain
	}
	if cfg.Tolerance < 0 || cfg.Tolerance >= 1 {
		return nil, fmt.Errorf("admission: reconcile tolerance %v is not in (0, 1)", cfg.Tolerance)
	}
	if cfg.Sustain < 0 {
		return nil, fmt.Errorf("admission: reconcile sustain %v is negative", cfg.Sustain)
	}
	return &Reconciler{cfg: cfg}, nil
}

// Last is what the last Observe returned.
func (r *Reconciler) Last() Reconciled { return r.last }

// Observe takes a reading and returns the GPU's figures after it. A
// reading older than the last one is ignored.
func (r *Reconciler) Observe(in Reading) Reconciled {
	if n := len(r.samples); n > 0 && in.At.Before(r.samples[n-1].at) {
		return r.last
	}
	own := int64(in.Running+1) * in.BlockBytes
	tol := int64(r.cfg.Tolerance*float64(in.Pool)) + own
	obs := max(0, in.Used-in.Accounted)
	s := reconSample{at: in.At}
	if obs > tol {
		s.u = obs - own
	}
	r.samples = append(r.samples, s)
	start := in.At.Add(-r.cfg.Sustain)
	// The least and the most u since start, the sample before start
	// standing for the time up to the first one after it: the level
	// rises to what has lasted the whole window, and falls to what has
	// not been passed in it, so that neither a spike nor a dip shorter
	// than Sustain moves it.
	low, high, reached := s.u, s.u, false
	for i := len(r.samples) - 1; i >= 0; i-- {
		low, high = min(low, r.samples[i].u), max(high, r.samples[i].u)
		if !r.samples[i].at.After(start) {
			reached = true
			break
		}
	}
	level := r.last.Unaccounted
	switch {
	case !reached:
	case low > level:
		level = low
	case high < level:
		level = high
	}
	// Keep what the next readings need: the samples since start, and the
	// one before it.
	keep := 0
	for i := len(r.samples) - 1; i >= 0; i-- {
		if r.samples[i].at.Before(start) {
			keep = i
			break
		}
	}
	r.samples = append(r.samples[:0], r.samples[keep:]...)
	r.last = Reconciled{Observed: obs, Tolerance: tol, Unaccounted: level}
	return r.last
}

// SetUnaccounted tells the scheduler how much of a GPU its backends hold
// that no admitted request accounts for (a Reconciler's Unaccounted):
// admissions to it are measured against its effective capacity less that,
// for as long as it is set. Like every shrink it revokes nothing; a lower
// figure admits the waiters that now fit.
func (s *Scheduler) SetUnaccounted(gpu string, bytes int64) error {
	if bytes < 0 {
		return fmt.Errorf("admission: unaccounted: %d bytes is negative", bytes)
	}
	s.mu.Lock()
	p := s.gpuByName[gpu]
	if p == nil {
		s.mu.Unlock()
		return fmt.Errorf("admission: unaccounted: unknown GPU %q", gpu)
	}
	old := p.admitCap()
	p.report.unaccounted = bytes
	if p.admitCap() > old {
		s.dispatchLocked()
	} else {
		s.checkLocked(opUnaccounted)
	}
	s.unlockNotify()
	return nil
}
