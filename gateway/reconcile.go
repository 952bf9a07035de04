package gateway

import (
	"log/slog"
	"sync"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/sharedbudget"
)

// reconcilers hold, per GPU budget (its scheduler id, which a reload
// keeps), the reconciliation of what its backends report in use with what
// the requests admitted there may hold (admission.Reconciler). What they
// find nobody admitted comes off the GPU's budget as its own input — the
// scheduler's SetUnaccounted for a gateway alone, the announced budget in
// a fleet, where the memory is the whole GPU's and every replica's lease
// must make room for it — beside the AIMD loop and the lease, so that
// every input that takes room off a GPU stays apart and named.
type reconcilers struct {
	mu   sync.Mutex // guards byID
	byID map[string]*gpuReconcile
}

// gpuReconcile is one GPU's reconciliation; mu serialises the reports of
// its backends, which the probes deliver from their own goroutines.
type gpuReconcile struct {
	mu  sync.Mutex
	cfg ReconcileConfig
	r   *admission.Reconciler
	// last is what the last report found, warned whether the warning of
	// the current episode has been logged; both under mu.
	last   admission.Reconciled
	warned bool
	// accounted is what the last report took the admitted requests to hold.
	accounted int64
	running   int
}

// forGPU returns id's reconciliation under cfg, a new one when cfg changed.
func (rs *reconcilers) forGPU(id string, cfg ReconcileConfig) *gpuReconcile {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.byID == nil {
		rs.byID = map[string]*gpuReconcile{}
	}
	g := rs.byID[id]
	if g != nil && g.cfg.Tolerance == cfg.Tolerance && g.cfg.Sustain.D == cfg.Sustain.D {
		return g
	}
	r, err := admission.NewReconciler(admission.ReconcileConfig{Tolerance: cfg.Tolerance, Sustain: cfg.Sustain.D})
	if err != nil {
		return nil // validated at load: not reached
	}
	g = &gpuReconcile{cfg: cfg, r: r}
	rs.byID[id] = g
	return g
}

// view is id's last figures, for /status and the metrics.
func (rs *reconcilers) view(id string) (reconcileView, bool) {
	rs.mu.Lock()
	g := rs.byID[id]
	rs.mu.Unlock()
	if g == nil {
		return reconcileView{}, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return reconcileView{Unaccounted: g.last.Unaccounted, Observed: g.last.Observed, Tolerance: g.last.Tolerance,
		Accounted: g.accounted, Running: g.running}, true
}

// reconcileView is a GPU's reconciliation in /status.
type reconcileView struct {
	// Unaccounted is the memory its backends hold that no admitted request
	// accounts for, sustained: what comes off its budget now.
	Unaccounted int64 `json:"unaccounted_bytes"`
	// Observed is the last report's use less Accounted (0 if negative);
	// Tolerance what it may reach without counting.
	Observed  int64 `json:"observed_bytes"`
	Tolerance int64 `json:"tolerance_bytes"`
	// Accounted is what the admitted requests may hold: this gateway's,
	// and in a fleet the other replicas' leases.
	Accounted int64 `json:"accounted_bytes"`
	// Running is the requests its backends report running.
	Running int `json:"backend_running"`
}

// reconcile reads g's backends' report against what is admitted there. In
// a gateway alone it sets the scheduler's input itself; in a fleet
// setBudget takes the last figure off the budget it announces, and the
// fleet reads the report for evidence that a silent replica's requests
// are gone.
func (s *Server) reconcile(rt *runtime, g *gpu, pool, used int64) {
	cfg := rt.cfg.Admission.Reconcile
	if !cfg.on() {
		if s.shared == nil {
			_ = rt.sched.SetUnaccounted(g.id, 0)
		}
		return
	}
	gr := rt.reconciled.forGPU(g.id, cfg)
	if gr == nil {
		return
	}
	st, ok := rt.sched.GPU(g.id)
	if !ok {
		return
	}
	in := admission.Reading{At: s.opt.Clock.Now(), Pool: pool, Used: used, Accounted: st.Now}
	if s.shared != nil {
		in.Accounted += othersLeased(s.shared.Leases(), g.id)
	}
	var waiting int64
	for _, be := range g.backends {
		if kv, have := be.KV(); have {
			in.Running += int(kv.Running)
			waiting += int64(kv.Waiting)
			in.BlockBytes = max(in.BlockBytes, int64(kv.BlockSize)*g.bytesPerToken[be])
		}
	}
	gr.mu.Lock()
	got := gr.r.Observe(in)
	was := gr.last.Unaccounted
	gr.last, gr.accounted, gr.running = got, in.Accounted, in.Running
	warn := got.Unaccounted > 0 && !gr.warned
	recovered := got.Unaccounted == 0 && was > 0
	if warn {
		gr.warned = true
	}
	if recovered {
		gr.warned = false
	}
	gr.mu.Unlock()
	switch {
	case warn:
		s.log.Warn("a GPU's backends hold KV memory that no admitted request accounts for: another client of the backend, or a count gone wrong; admitting that much less there while it lasts",
			"gpu", g.name, "unaccounted", got.Unaccounted, "used", used, "accounted", in.Accounted,
			"tolerance", got.Tolerance, "backend_running", in.Running, "admitted_running", st.Tickets)
	case recovered:
		s.log.Info("a GPU's unaccounted KV memory is gone; its budget is whole again", slog.String("gpu", g.name))
	}
	if s.shared == nil {
		if err := rt.sched.SetUnaccounted(g.id, got.Unaccounted); err != nil {
			s.log.Error("take unaccounted memory off a GPU's budget", "gpu", g.name, "err", err)
		}
		return
	}
	// The same report tells the fleet whether a silent replica's requests
	// still run on the GPU (its residual hold ends when they do not).
	s.shared.Observe(g.id, sharedbudget.Report{Used: used, Own: st.Now, Tolerance: got.Tolerance,
		Running: int64(in.Running) + waiting, OwnRunning: int64(st.Tickets)})
}

// othersLeased is what the other replicas of a fleet lease on the GPU
// whose pool is id, their residual holds included: what their requests may
// hold there.
func othersLeased(leases []sharedbudget.LeaseStatus, id string) int64 {
	for _, ls := range leases {
		if ls.ID == id {
			return max(0, ls.Stats.FleetLeased-ls.Stats.Leased)
		}
	}
	return 0
}
