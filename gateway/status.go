package gateway

import (
	"fmt"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/sharedbudget"
	"github.com/kvgate/kvgate/kvbudget"
)

// The operator's JSON view at GET /status: per GPU its budget (configured,
// capacity, what is held and committed, what its backends really use, the
// requests bound to it); per model its waiting requests by class and what
// its output-length predictor has learned; backends with their circuits and
// KV reports; and the admission counters.
type statusView struct {
	Policy    policyView       `json:"policy"`
	GPUs      []gpuView        `json:"gpus"`
	Models    []modelQueueView `json:"queues"`
	Backends  []backendView    `json:"backends"`
	ModelInfo []modelView      `json:"models"`
	Tenants   []tenantView     `json:"tenants"`
	Counters  counterView      `json:"admission"`

	// SharedBudget is this replica's part of a fleet sharing the budgets
	// (package sharedbudget); absent when the budget is this process's alone.
	SharedBudget *sharedbudget.Status `json:"shared_budget,omitempty"`
	// GPUWatch is the GPU memory watch's source, or why there is none
	// (gpuwatch.go); each GPU's memory is in its gpus entry.
	GPUWatch *gpuWatchView `json:"gpu_watch"`
}

type policyView struct {
	Mode        string  `json:"mode"`
	Reservation string  `json:"reservation"`
	Epsilon     float64 `json:"epsilon,omitempty"`
	// ResumableEpsilon is the bound of a stream the guard can stop and
	// resume (predicted only).
	ResumableEpsilon float64 `json:"resumable_epsilon,omitempty"`
	Routing          string  `json:"routing"`
	Backfill         bool    `json:"backfill"`
	// Preemption: a higher class may start on room of lower classes'
	// resumable streams (predicted only, never on a shared budget).
	Preemption bool `json:"preemption"`
}

type gpuView struct {
	GPU      string   `json:"gpu"`
	Pool     string   `json:"pool,omitempty"` // the admission pool, when a rename kept an older one
	Backends []string `json:"backends"`
	// Configured is the budget from the config, before clamping to the
	// backends' reported pool.
	Configured int64 `json:"configured_bytes"`
	// ReportedPool is the KV pool the backends report allocating (0 until
	// they do); Unusable and Warning say how much of it the ceiling leaves
	// unused, and how to fix it.
	ReportedPool int64   `json:"reported_pool_bytes"`
	Unusable     int64   `json:"unusable_bytes,omitempty"`
	Warning      string  `json:"warning,omitempty"`
	Capacity     int64   `json:"capacity_bytes"`
	Effective    int64   `json:"effective_bytes"`
	Held         int64   `json:"held_bytes"`
	Committed    int64   `json:"committed_bytes"`
	Running      int64   `json:"running_bytes"` // what its requests may hold now: the guard's account
	Used         *int64  `json:"used_bytes"`
	Utilization  float64 `json:"utilization"`
	Bound        int     `json:"bound_requests"`
	Gated        bool    `json:"headroom_gate"`
	DrainRate    float64 `json:"drain_rate_bytes_per_second"`
	Reserved     *string `json:"reserved_for,omitempty"` // the model whose head request holds a reservation
	// SharesPrompts says its backends hold a shared prompt block once, as
	// they last reported (prefix caching); Shared is the bytes of such
	// blocks it counts once (part of Held), SharedSaved what counting them
	// once per request would add, SharedFound the share of admitted
	// requests' shareable prompt blocks found held already.
	SharesPrompts bool    `json:"shares_prompts"`
	Shared        int64   `json:"shared_bytes"`
	SharedSaved   int64   `json:"shared_saved_bytes"`
	SharedFound   float64 `json:"shared_found_ratio"`

	// Limit is this replica's lease under a shared budget: admissions are
	// measured against the smaller of it and Effective.
	Limit *int64 `json:"limit_bytes,omitempty"`
	// MarginScale is the share of the forecast's safety margin this replica
	// keeps: 1/√k when it runs one of k like batches on the GPU (predicted
	// reservations under a shared budget); absent when it is 1.
	MarginScale float64 `json:"margin_scale,omitempty"`

	// Memory is the GPU's memory and the processes holding it, as the GPU
	// memory watch last read them; absent without a watch (gpuwatch.go).
	Memory *gpuMemoryView `json:"gpu_memory,omitempty"`
	// Cuts are the reductions of Capacity, each with its cause and why.
	Cuts []budgetCutView `json:"budget_cuts,omitempty"`
	// Reconcile is what its backends report in use against what the
	// requests admitted there may hold (absent until they have reported):
	// its unaccounted_bytes come off what it admits.
	Reconcile *reconcileView `json:"reconcile,omitempty"`
}

type modelQueueView struct {
	Model        string      `json:"model"`
	Queued       int         `json:"queued"`
	QueuedBytes  int64       `json:"queued_bytes"`
	Classes      []classView `json:"classes"`
	GPUs         []routeView `json:"gpus"`
	Predicting   bool        `json:"predicting"`
	Samples      float64     `json:"length_samples"`
	MedianLength int         `json:"median_output_tokens,omitempty"`
	P90Length    int         `json:"p90_output_tokens,omitempty"`
	// Distrusted: its forecast was shown wrong; its requests are held at
	// their worst case for admission.cool_down.
	Distrusted bool `json:"distrusted"`
}

// routeView is one GPU a model may be bound to, and whether it takes binds
// now (its circuit closed, its backend configured).
type routeView struct {
	GPU string `json:"gpu"`
	Up  bool   `json:"up"`
}

type tenantView struct {
	Name        string `json:"name"`
	HeldBytes   int64  `json:"held_bytes"`
	Queued      int    `json:"queued"`
	QueuedBytes int64  `json:"queued_bytes"`
}

type classView struct {
	Name        string `json:"name"`
	Queued      int    `json:"queued"`
	QueuedBytes int64  `json:"queued_bytes"`
	Held        int64  `json:"held_bytes"`
}

type counterView struct {
	Admitted          int64            `json:"admitted"`
	AdmittedAfterWait int64            `json:"admitted_after_wait"`
	Backfilled        int64            `json:"backfilled"`
	Preemptive        int64            `json:"preemptive"`
	Rejected          map[string]int64 `json:"rejected"`
	Canceled          int64            `json:"canceled"`
	// GuardStops, ForecastTrips and DriftTrips: see
	// kvgate_admission_guard_stops_total,
	// kvgate_admission_forecast_trips_total and
	// kvgate_admission_drift_trips_total.
	GuardStops    int64            `json:"guard_stops"`
	ForecastTrips map[string]int64 `json:"forecast_trips"`
	DriftTrips    map[string]int64 `json:"drift_trips"`
}

type kvView struct {
	At                   string  `json:"at"`
	Usage                float64 `json:"usage"`
	Running              float64 `json:"running"`
	Waiting              float64 `json:"waiting"`
	Preemptions          float64 `json:"preemptions"`
	NumGPUBlocks         int64   `json:"num_gpu_blocks"`
	BlockSize            int     `json:"block_size"`
	GPUMemoryUtilization float64 `json:"gpu_memory_utilization"`
}

type backendView struct {
	Name      string   `json:"name"`
	URL       string   `json:"url"`
	GPU       string   `json:"gpu"`
	Models    []string `json:"models"`
	State     string   `json:"state"`
	LastError string   `json:"last_error,omitempty"`
	KV        *kvView  `json:"kv,omitempty"`
	// KVEvents is its KV-event subscriber's state; absent without one.
	KVEvents *kvEventsView `json:"kv_events,omitempty"`
}

type modelView struct {
	Name          string `json:"name"`
	MaxModelLen   int    `json:"max_model_len"`
	Tokenizer     string `json:"tokenizer"`
	TP            int    `json:"tp"`
	BlockSize     int    `json:"block_size"`
	BytesPerToken int64  `json:"bytes_per_token"`
	BytesPerBlock int64  `json:"bytes_per_block"`
	WeightBytes   int64  `json:"weight_bytes"`
	// Estimate is how prompts /tokenize does not count are counted: the
	// byte bound, or calibrated (estimate.go).
	Estimate estimateState `json:"estimate"`
	// TokenizeCache is the cache of /tokenize answers; absent without one.
	TokenizeCache *tokenCacheView `json:"tokenize_cache,omitempty"`
}

type tokenCacheView struct {
	Entries  int     `json:"entries"`
	Capacity int     `json:"capacity"`
	Hits     int64   `json:"hits"`
	Misses   int64   `json:"misses"`
	HitRate  float64 `json:"hit_rate"`
	Stale    int64   `json:"stale"`
}

func (s *Server) status() statusView {
	rt := s.rt.Load()
	a := rt.cfg.Admission
	v := statusView{Policy: policyView{Mode: a.Mode, Reservation: a.Reservation, Routing: rt.cfg.Routing, Backfill: a.Backfill.IsEnabled()}}
	if a.Mode == modeCount {
		v.Policy.Reservation = ""
	} else if a.Reservation == admission.Predicted {
		v.Policy.Epsilon, v.Policy.ResumableEpsilon = a.epsilon(), a.resumableEpsilon()
		v.Policy.Preemption = a.Preemption.IsEnabled() && rt.cfg.SharedBudget == nil
	}
	st := rt.sched.Stats()
	for _, p := range st.GPUs {
		g := rt.gpuByID[p.Name]
		if g == nil {
			continue // a pool a reload removed, draining its last tickets
		}
		gv := gpuView{GPU: g.name, Configured: g.nominal, Capacity: p.Capacity, Effective: p.Effective, Held: p.Held,
			Committed: p.Committed, Running: p.Now, Bound: p.Tickets, Gated: p.Gated, DrainRate: p.DrainRate,
			SharesPrompts: g.sharing.Load(), Shared: p.Shared, SharedSaved: p.SharedSaved}
		if p.PromptBlocks > 0 {
			gv.SharedFound = float64(p.SharedBlocks) / float64(p.PromptBlocks)
		}
		if g.id != g.name {
			gv.Pool = g.id
		}
		if p.Limit >= 0 {
			limit := p.Limit
			gv.Limit = &limit
		}
		if p.Margin != 1 {
			gv.MarginScale = p.Margin
		}
		if rv, ok := rt.reconciled.view(g.id); ok {
			gv.Reconcile = &rv
		}
		if p.UsedKnown {
			used := p.Used
			gv.Used = &used
		}
		if p.Reserved != "" || p.Blocking {
			r := p.Reserved
			gv.Reserved = &r
		}
		if p.Effective > 0 {
			gv.Utilization = float64(p.Committed) / float64(p.Effective)
		}
		if pool, _, ok := g.reported(); ok && !rt.count {
			gv.ReportedPool = pool
			if pool > g.nominal {
				gv.Unusable = pool - g.nominal
				gv.Warning = fmt.Sprintf("The backends allocated a KV pool of %s, but the ceiling %.2f leaves a budget of %s: %s of it will never be used. Start the backend with --gpu-memory-utilization %.2f (the ceiling), or raise admission.ceiling.",
					kvbudget.FormatBytes(pool), a.Ceiling, kvbudget.FormatBytes(g.nominal), kvbudget.FormatBytes(pool-g.nominal), a.Ceiling)
			}
		}
		for _, b := range g.backends {
			gv.Backends = append(gv.Backends, b.Name())
		}
		v.GPUs = append(v.GPUs, gv)
	}
	for _, q := range st.Queues {
		mv := modelQueueView{Model: q.Name, Queued: q.Queued, QueuedBytes: q.QueuedBytes, Predicting: q.Predicting,
			Samples: q.Samples, MedianLength: q.MedianLength, P90Length: q.P90Length, Distrusted: q.Distrusted}
		for _, c := range q.Classes {
			mv.Classes = append(mv.Classes, classView(c))
		}
		for _, r := range q.GPUs {
			name := r.GPU
			if g := rt.gpuByID[r.GPU]; g != nil {
				name = g.name
			}
			mv.GPUs = append(mv.GPUs, routeView{GPU: name, Up: r.Up})
		}
		v.Models = append(v.Models, mv)
	}
	for _, t := range st.Tenants {
		v.Tenants = append(v.Tenants, tenantView{Name: t.Name, HeldBytes: t.Held, Queued: t.Queued, QueuedBytes: t.QueuedBytes})
	}
	if s.shared != nil {
		v.SharedBudget = s.shared.Status()
	}
	v.GPUWatch = s.gpuWatch.status(v.GPUs)
	v.Counters = counterView{Admitted: st.Admitted, AdmittedAfterWait: st.AdmittedAfterWait, Backfilled: st.Backfilled, Preemptive: st.Preemptive,
		Rejected: st.Rejected, Canceled: st.Canceled, GuardStops: st.GuardStops, ForecastTrips: st.Trips, DriftTrips: st.DriftTrips}
	for _, b := range rt.upstreams.Backends() {
		sp := b.Spec()
		bv := backendView{Name: b.Name(), URL: sp.URL, GPU: rt.gpuOf[b].name, Models: sp.Models, State: string(b.State()), LastError: b.LastError(),
			KVEvents: s.kvEventsStatus(b.Name())}
		if kv, ok := b.KV(); ok {
			bv.KV = &kvView{At: kv.At.UTC().Format(time.RFC3339Nano), Usage: kv.Usage, Running: kv.Running, Waiting: kv.Waiting,
				Preemptions: kv.Preemptions, NumGPUBlocks: kv.NumGPUBlocks, BlockSize: kv.BlockSize, GPUMemoryUtilization: kv.GPUMemoryUtilization}
		}
		v.Backends = append(v.Backends, bv)
	}
	for _, name := range rt.modelOrder {
		m := rt.models[name]
		mv := modelView{
			Name: name, MaxModelLen: m.maxLen, Tokenizer: m.tokenizer, TP: m.layout.TP, BlockSize: m.layout.BlockSize,
			BytesPerToken: m.layout.BytesPerToken, BytesPerBlock: m.layout.BytesPerBlock, WeightBytes: m.weights,
			Estimate: m.est.state(),
		}
		if c := m.tokens; c != nil {
			tv := &tokenCacheView{Entries: c.len(), Capacity: c.capacity, Hits: c.hits.Load(), Misses: c.misses.Load(), Stale: c.stale.Load()}
			if n := tv.Hits + tv.Misses; n > 0 {
				tv.HitRate = float64(tv.Hits) / float64(n)
			}
			mv.TokenizeCache = tv
		}
		v.ModelInfo = append(v.ModelInfo, mv)
	}
	return v
}
