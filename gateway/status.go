package gateway

import (
	"sort"
	"time"
)

// The operator's JSON view at GET /status: budgets with their queues per
// class and tenant, backends with their circuits and KV reports, models with
// their per-token cost.
type statusView struct {
	Budgets  []budgetView  `json:"budgets"`
	Backends []backendView `json:"backends"`
	Models   []modelView   `json:"models"`
}

type budgetView struct {
	GPU      string   `json:"gpu"`
	Backends []string `json:"backends"`
	// Configured is the budget from the config, before clamping to the
	// backend's reported pool.
	Configured  int64   `json:"configured_bytes"`
	Capacity    int64   `json:"capacity_bytes"`
	Effective   int64   `json:"effective_bytes"`
	Held        int64   `json:"held_bytes"`
	Queued      int     `json:"queued"`
	QueuedBytes int64   `json:"queued_bytes"`
	Utilization float64 `json:"utilization"`
	DrainRate   float64 `json:"drain_rate_bytes_per_second"`

	Admitted          int64            `json:"admitted"`
	AdmittedAfterWait int64            `json:"admitted_after_wait"`
	Rejected          map[string]int64 `json:"rejected"`
	Canceled          int64            `json:"canceled"`
	Classes           []classView      `json:"classes"`
	Tenants           []tenantView     `json:"tenants"`
}

type classView struct {
	Name        string `json:"name"`
	Queued      int    `json:"queued"`
	QueuedBytes int64  `json:"queued_bytes"`
	Held        int64  `json:"held_bytes"`
}

type tenantView struct {
	Name        string `json:"name"` // "" is anonymous
	Cap         int64  `json:"cap_bytes"`
	Held        int64  `json:"held_bytes"`
	Queued      int    `json:"queued"`
	QueuedBytes int64  `json:"queued_bytes"`
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
}

type modelView struct {
	Name          string  `json:"name"`
	MaxModelLen   int     `json:"max_model_len"`
	Tokenizer     string  `json:"tokenizer"`
	TP            int     `json:"tp"`
	BlockSize     int     `json:"block_size"`
	BytesPerToken int64   `json:"bytes_per_token"`
	BytesPerBlock int64   `json:"bytes_per_block"`
	WeightBytes   int64   `json:"weight_bytes"`
	EstimateRatio float64 `json:"estimate_bytes_per_token"`
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
	var v statusView
	for name, g := range rt.groups {
		st := g.budget.Stats()
		bv := budgetView{
			GPU: name, Configured: g.nominal, Capacity: st.Capacity, Effective: st.Effective, Held: st.Held,
			Queued: st.Queued, QueuedBytes: st.QueuedBytes, DrainRate: st.DrainRate,
			Admitted: st.Admitted, AdmittedAfterWait: st.AdmittedAfterWait, Rejected: st.Rejected, Canceled: st.Canceled,
		}
		for _, c := range st.Classes {
			bv.Classes = append(bv.Classes, classView(c))
		}
		for _, t := range st.Tenants {
			bv.Tenants = append(bv.Tenants, tenantView(t))
		}
		if st.Effective > 0 {
			bv.Utilization = float64(st.Held) / float64(st.Effective)
		}
		for _, b := range g.backends {
			bv.Backends = append(bv.Backends, b.Name())
		}
		v.Budgets = append(v.Budgets, bv)
	}
	sort.Slice(v.Budgets, func(i, j int) bool { return v.Budgets[i].GPU < v.Budgets[j].GPU })
	for _, b := range rt.pool.Backends() {
		sp := b.Spec()
		bv := backendView{Name: b.Name(), URL: sp.URL, GPU: rt.groupOf[b].name, Models: sp.Models, State: string(b.State()), LastError: b.LastError()}
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
			EstimateRatio: m.est.bytesPerToken(),
		}
		if c := m.tokens; c != nil {
			tv := &tokenCacheView{Entries: c.len(), Capacity: c.capacity, Hits: c.hits.Load(), Misses: c.misses.Load(), Stale: c.stale.Load()}
			if n := tv.Hits + tv.Misses; n > 0 {
				tv.HitRate = float64(tv.Hits) / float64(n)
			}
			mv.TokenizeCache = tv
		}
		v.Models = append(v.Models, mv)
	}
	return v
}
