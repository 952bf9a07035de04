package gateway

import (
	"sync"

	"github.com/kvgate/kvgate/backends"
)

// reportMemo is what the server remembers of the backends' reports, to
// log or count each change once.
type reportMemo struct {
	warnedBlocks sync.Map // *backends.Backend → true once its block size mismatch is logged
	warnedPools  sync.Map // GPU name → true once its unusable memory is logged
	preemptions  sync.Map // *backends.Backend → its last reported preemption counter
}

// A backend's KV reports (each probe of its /metrics) close the loop on
// its own account of its KV cache: they set its GPU's budget, feed
// reconciliation and the feedback loop, and say when it preempted.

// onKVReport closes the loop on a backend's own account of its KV cache:
// the budget never exceeds the pool the backend really has; what it reports
// in use is the ground truth the predicted policy's gate reads; and the
// budget shrinks while the backends of a GPU report more in use than the
// budget, or preemptions (the backend ran out of blocks), and grows back
// slowly otherwise. Every probe also refreshes which GPUs may take each
// model's requests.
func (s *Server) onKVReport(rt *runtime, b *backends.Backend, r backends.KVReport, ok bool) {
	if s.rt.Load() != rt {
		return // a report of a configuration already replaced
	}
	rt.syncRoutes()
	s.backendLog.observe(b, "")
	if !ok || rt.count {
		return
	}
	s.noteKVCapacity(b, r)
	g := rt.gpuOf[b]
	pool, used, known := g.reported()
	if !known {
		return
	}
	if r.BlockSize != rt.models[b.Spec().Models[0]].layout.BlockSize {
		if _, seen := s.reports.warnedBlocks.LoadOrStore(b, true); !seen {
			s.log.Warn("backend's KV block size differs from the model's block_size: reservations are rounded wrongly",
				"backend", b.Name(), "reported", r.BlockSize, "configured", rt.models[b.Spec().Models[0]].layout.BlockSize)
		}
	}
	if pool > g.nominal {
		if _, seen := s.reports.warnedPools.LoadOrStore(g.id, true); !seen {
			s.log.Warn("the backends' KV pool is larger than the GPU's budget: the difference will never be used",
				"gpu", g.name, "pool", pool, "budget", g.nominal, "unused", pool-g.nominal,
				"fix", g.oversizeFix(pool))
		}
	}
	whole := min(g.nominal, pool) // what g.capacity() says, without reading the reports twice
	s.reconcile(rt, g, pool, used)
	if kv, ok := b.KV(); ok && kv.HasPool() {
		s.poolReported(rt, g, b.Name(), kv.NumGPUBlocks*int64(kv.BlockSize)*g.bytesPerToken[b])
	}
	s.setBudget(rt, g, pool, s.budgetOf(g, pool, true))
	if on := rt.shares(g); g.sharing.Swap(on) != on || on {
		if err := rt.sched.SetSharing(g.id, on); err != nil {
			s.log.Error("record whether a GPU shares prompt blocks", "gpu", g.name, "err", err)
		}
	}
	s.checkSharing(rt, g)
	if err := rt.sched.SetUsage(g.id, used, true); err != nil {
		s.log.Error("record a backend's KV usage", "gpu", g.name, "err", err)
	}
	preempted := s.preemptionsRose(b, r.Preemptions)
	if preempted {
		// The backend ran out of blocks: whatever the forecast said was
		// wrong, and the GPU goes to worst-case admission for the cool-down.
		rt.sched.Overflowed(g.id)
	}
	if rt.cfg.Admission.Feedback.on() {
		// Against the budget before the watch's cut: use over the cut part
		// is what the cut asks for, not a forecast that was low.
		if err := rt.sched.Feedback(g.id, used > whole || preempted); err != nil {
			s.log.Error("feed a backend's KV usage back to its budget", "gpu", g.name, "err", err)
		}
	}
}

// budgetOf is the capacity g admits against, from its named inputs: the
// configured budget, the KV pool its backends report when that is smaller
// (known), less the cut of the GPU memory watch while the GPU's free memory
// is under its floor (gpuwatch.go). Never below 1: Resize takes no 0, and
// a byte admits nothing.
func (s *Server) budgetOf(g *gpu, pool int64, known bool) int64 {
	b := g.nominal
	if known {
		b = min(b, pool)
	}
	b -= s.gpuWatch.memoryCut(g.name)
	return max(b, 1)
}

// applyBudget sets g's budget from its inputs now, as a KV report would:
// the watch calls it when its cut changes.
func (s *Server) applyBudget(rt *runtime, g *gpu) {
	if rt.count || s.rt.Load() != rt {
		return
	}
	pool, _, known := g.reported()
	s.setBudget(rt, g, pool, s.budgetOf(g, pool, known))
}

// setBudget gives the scheduler (and the fleet's lessee) g's budget. A
// gateway alone takes unaccounted memory off through the scheduler's own
// input (reconcile); a fleet announces the budget less it, since that
// memory is the whole GPU's and every replica's lease must make room.
func (s *Server) setBudget(rt *runtime, g *gpu, pool, want int64) {
	s.budgetMu.Lock()
	defer s.budgetMu.Unlock()
	if s.rt.Load() != rt {
		return // replaced since its report was read: the new runtime's budget stands
	}
	if s.shared != nil {
		cut := int64(0)
		if v, ok := rt.reconciled.view(g.id); ok && rt.cfg.Admission.Reconcile.on() {
			cut = min(v.Unaccounted, want-1)
		}
		s.shared.SetBudget(g.id, want-cut)
	}
	resized := true
	if st, _ := rt.sched.GPU(g.id); st.Capacity != want {
		resized = rt.sched.Resize(g.id, want) == nil
	}
	if resized {
		s.backendLog.budget(g, pool, want)
	}
}

// preemptionsRose says whether b's preemption counter rose since its last
// report (a restarted backend's counter starting over is not a rise).
func (s *Server) preemptionsRose(b *backends.Backend, n float64) bool {
	prev, seen := s.reports.preemptions.Swap(b, n)
	return seen && n > prev.(float64)
}
