package gateway

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/backends/gpuinfo"
	"github.com/kvgate/kvgate/kvbudget"
)

// runtime is everything a configuration turns into. A request loads the
// current runtime once and uses it throughout, so a reload never changes
// the rules under a request in flight; budgets and backends that survive a
// reload are the same objects, so held reservations and open connections
// carry over.
type runtime struct {
	cfg    *Config
	models map[string]*model
	// modelOrder is the configured order, for /v1/models.
	modelOrder []string
	tenants    map[string]*tenant // by API key
	auth       bool               // keys are required
	classRank  map[string]int     // 0 is the highest priority
	groups     map[string]*group  // by GPU name
	groupOf    map[*backends.Backend]*group
	pool       *backends.Pool
}

type tenant struct {
	name  string
	class string
}

// group is one GPU (or TP group) and its admission budget, shared by the
// backends that run on it.
type group struct {
	name     string
	budget   *admission.Budget
	nominal  int64 // from the config: gpu_memory × ceiling − weights − reserve − other
	backends []*backends.Backend
	// bytesPerToken of the model each backend serves, on one GPU: with the
	// block size the backend reports, it turns its pool (in blocks) into
	// bytes.
	bytesPerToken map[*backends.Backend]int64
}

// pool is what the backends of g report of their KV pools: their total
// size and the part in use, in bytes of one GPU. ok is false until every
// backend of the group has reported both.
func (g *group) pool() (pool, used int64, ok bool) {
	for _, be := range g.backends {
		kv, have := be.KV()
		if !have || !kv.HasPool() || !kv.HasUsage {
			return 0, 0, false
		}
		bytes := kv.NumGPUBlocks * int64(kv.BlockSize) * g.bytesPerToken[be]
		pool += bytes
		used += int64(kv.Usage * float64(bytes))
	}
	return pool, used, len(g.backends) > 0
}

// capacity is the budget g admits against: its configured size, or less if
// its backends' pools are smaller.
func (g *group) capacity() int64 {
	if pool, _, ok := g.pool(); ok && pool < g.nominal {
		return pool
	}
	return g.nominal
}

// buildRuntime turns a validated config into a runtime, reusing what prev
// holds for budgets and backends that did not change. It has no effect on
// prev: budgets are reconfigured by commit, once everything else is known
// to be good.
func buildRuntime(cfg *Config, prev *runtime, opt *Options) (*runtime, []func(), error) {
	rt := &runtime{
		cfg: cfg, models: map[string]*model{}, tenants: map[string]*tenant{},
		classRank: map[string]int{}, groups: map[string]*group{}, groupOf: map[*backends.Backend]*group{},
	}
	var errs []error
	for i, mc := range cfg.Models {
		var old *model
		if prev != nil {
			old = prev.models[mc.Name]
		}
		m, err := buildModel(cfg, mc, old)
		if err != nil {
			errs = append(errs, fmt.Errorf("models[%d] (%s): %w", i, mc.Name, err))
			continue
		}
		rt.models[mc.Name] = m
		rt.modelOrder = append(rt.modelOrder, mc.Name)
	}
	for i, c := range cfg.Admission.Classes {
		rt.classRank[c.Name] = i
	}
	for _, t := range cfg.Tenants {
		tn := &tenant{name: t.Name, class: t.Class}
		for _, k := range t.APIKeys {
			rt.tenants[k] = tn
			rt.auth = true
		}
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}

	// GPU groups: memory and the models whose weights sit on them.
	type groupSpec struct {
		memory, other, explicit int64
		field                   string
		weights                 map[string]int64
		urls                    map[string]bool
	}
	specs := map[string]*groupSpec{}
	var order []string
	for i, bc := range cfg.Backends {
		f := fmt.Sprintf("backends[%d]", i)
		gs := specs[bc.GPU]
		if gs == nil {
			gs = &groupSpec{weights: map[string]int64{}, urls: map[string]bool{}, field: f}
			specs[bc.GPU] = gs
			order = append(order, bc.GPU)
		}
		mem, err := gpuMemory(bc.GPUMemory, opt.probeGPUs)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.gpu_memory: %w", f, err))
			continue
		}
		if gs.memory != 0 && mem != 0 && mem != gs.memory {
			errs = append(errs, fmt.Errorf("%s.gpu_memory: %s differs from another backend on gpu %q", f, bc.GPUMemory, bc.GPU))
		}
		gs.memory = max(gs.memory, mem)
		gs.other = max(gs.other, bc.OtherUsed.Bytes)
		gs.explicit = max(gs.explicit, bc.KVBudget.Bytes)
		gs.urls[bc.URL] = true
		for _, name := range bc.Models {
			gs.weights[name] = rt.models[name].weightsPerGPU()
		}
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}

	// The budget a group carries over: its own under the same name, or, for a
	// renamed GPU (a backend renamed without an explicit gpu), the budget of
	// a vanished group whose backends it keeps — a new empty budget there
	// would admit a second full budget next to the streams still running.
	carried := func(name string, urls map[string]bool) *admission.Budget {
		if prev == nil {
			return nil
		}
		if g := prev.groups[name]; g != nil {
			return g.budget
		}
		for oldName, g := range prev.groups {
			if specs[oldName] != nil {
				continue
			}
			for _, be := range g.backends {
				if urls[be.Spec().URL] {
					return g.budget
				}
			}
		}
		return nil
	}
	type reconfig struct {
		g    *group
		acfg admission.Config
	}
	var reconfigs []reconfig
	for _, name := range order {
		gs := specs[name]
		capacity := gs.explicit
		if capacity == 0 {
			var w int64
			for _, b := range gs.weights {
				w += b
			}
			kv, err := kvbudget.GPUBudget{Memory: gs.memory, Ceiling: cfg.Admission.Ceiling, Weights: w, Reserve: cfg.Admission.Reserve.Bytes, OtherUsed: gs.other}.KVBytes()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: gpu %q: %w", gs.field, name, err))
				continue
			}
			capacity = kv
		}
		acfg := admissionConfig(cfg, capacity, opt)
		g := &group{name: name, nominal: capacity, bytesPerToken: map[*backends.Backend]int64{}}
		if old := carried(name, gs.urls); old != nil {
			// Validate now; apply in commit, after every other part built.
			if _, err := admission.New(acfg); err != nil {
				errs = append(errs, fmt.Errorf("admission (gpu %q): %w", name, err))
				continue
			}
			g.budget = old
			reconfigs = append(reconfigs, reconfig{g, acfg})
		} else {
			acfg.Observer = opt.observerFor(name)
			b, err := admission.New(acfg)
			if err != nil {
				errs = append(errs, fmt.Errorf("admission (gpu %q): %w", name, err))
				continue
			}
			g.budget = b
		}
		rt.groups[name] = g
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}

	var list []*backends.Backend
	for i, bc := range cfg.Backends {
		g := rt.groups[bc.GPU]
		spec := backendSpec(bc)
		var be *backends.Backend
		if prev != nil {
			for _, old := range prev.pool.Backends() {
				if old.Name() == bc.Name && prev.groupOf[old].budget == g.budget && sameSpec(old.Spec(), spec) {
					be = old
				}
			}
		}
		if be == nil {
			var err error
			be, err = backends.NewBackend(spec, g.budget, opt.Now)
			if err != nil {
				errs = append(errs, fmt.Errorf("backends[%d]: %w", i, err))
				continue
			}
		}
		list = append(list, be)
		rt.groupOf[be] = g
		g.backends = append(g.backends, be)
		g.bytesPerToken[be] = rt.models[bc.Models[0]].layout.BytesPerToken
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	rt.pool = backends.NewPool(list)
	var commits []func()
	for _, r := range reconfigs {
		// Keep the clamp to the pools the backends reported: reconfiguring
		// to the configured size would admit past them until the next scrape.
		r.acfg.Capacity = r.g.capacity()
		commits = append(commits, func() { _ = r.g.budget.Reconfigure(r.acfg) })
	}
	return rt, commits, nil
}

// sameSpec says whether a backend made from b would be the backend a
// already is; only then is it reused across a reload.
func sameSpec(a, b backends.Spec) bool { return reflect.DeepEqual(a, b.WithDefaults()) }

func backendSpec(bc BackendConfig) backends.Spec {
	return backends.Spec{
		Name: bc.Name, URL: bc.URL, Models: bc.Models, APIKey: bc.APIKey,
		HealthPath: bc.Health.Path, HealthInterval: bc.Health.Interval.D, HealthTimeout: bc.Health.Timeout.D,
		FailThreshold: bc.Health.Failures, Cooldown: bc.Health.Cooldown.D,
		MetricsPath: bc.Scrape.Path, ScrapeInterval: bc.Scrape.Interval.D,
		FirstByteTimeout: bc.FirstByteTimeout.D, TokenizeTimeout: bc.TokenizeTimeout.D,
		Upstream: backends.UpstreamOptions{MaxConns: bc.MaxConnections},
	}
}

// admissionConfig maps the gateway's admission section onto one budget.
func admissionConfig(cfg *Config, capacity int64, opt *Options) admission.Config {
	a := cfg.Admission
	q := a.Queue
	classes := make([]admission.ClassConfig, len(a.Classes))
	for i, c := range a.Classes {
		cc := admission.ClassConfig{Name: c.Name, MaxQueued: q.MaxRequests, MaxQueuedBytes: q.MaxBytes.Bytes, QueueTimeout: q.Timeout.D, Sheddable: *c.Sheddable}
		if c.MaxRequests != 0 {
			cc.MaxQueued = c.MaxRequests
		}
		if c.MaxBytes.Bytes != 0 {
			cc.MaxQueuedBytes = c.MaxBytes.Bytes
		}
		if c.Timeout.D != 0 {
			cc.QueueTimeout = c.Timeout.D
		}
		classes[i] = cc
	}
	var tenants []admission.TenantConfig
	for _, t := range cfg.Tenants {
		tenants = append(tenants, admission.TenantConfig{Name: t.Name, Share: t.Share, QueueShare: t.QueueShare})
	}
	ac := admission.Config{
		Capacity: capacity, Classes: classes, DefaultClass: a.DefaultClass, Tenants: tenants,
		DefaultTenantShare: a.DefaultTenantShare, PressureThreshold: a.Pressure,
		DrainWindow: a.DrainWindow.D, MaxRetryAfter: a.MaxRetryAfter.D, Clock: opt.Clock,
		AIMD: admission.AIMDConfig{Decrease: a.Feedback.Decrease, Increase: a.Feedback.Increase, MinFraction: a.Feedback.MinFraction},
	}
	return ac
}

// gpuMemory reads a backend's gpu_memory: a size, or nvml[:index].
func gpuMemory(s string, probe func() ([]gpuinfo.Device, error)) (int64, error) {
	if s == "" {
		return 0, nil
	}
	if !strings.HasPrefix(s, "nvml") {
		sz, err := kvbudget.ParseMemory(s)
		return sz.Bytes, err
	}
	idx := 0
	if rest, ok := strings.CutPrefix(s, "nvml:"); ok {
		var err error
		if idx, err = strconv.Atoi(rest); err != nil || idx < 0 {
			return 0, fmt.Errorf("%q: want nvml or nvml:INDEX", s)
		}
	} else if s != "nvml" {
		return 0, fmt.Errorf("%q: want a size, nvml or nvml:INDEX", s)
	}
	devs, err := probe()
	if err != nil {
		return 0, fmt.Errorf("nvml: %w (give the size instead, e.g. 24GiB)", err)
	}
	if idx >= len(devs) {
		return 0, fmt.Errorf("nvml: GPU %d not found (%d visible)", idx, len(devs))
	}
	return devs[idx].Total, nil
}

// classFor picks the admission class of a request: the tenant's class, or
// a lower one the client asked for in the priority header. A request never
// rises above its tenant's class.
func (rt *runtime) classFor(t *tenant, asked []byte) (string, error) {
	own := rt.cfg.Admission.DefaultClass
	if t != nil {
		own = t.class
	}
	if len(asked) == 0 {
		return own, nil
	}
	rank, ok := rt.classRank[string(asked)]
	if !ok {
		return "", fmt.Errorf("unknown priority class %q", asked)
	}
	if t == nil && !rt.auth {
		return string(asked), nil // no tenants: clients are trusted to choose
	}
	if rank < rt.classRank[own] {
		return own, nil
	}
	return string(asked), nil
}
