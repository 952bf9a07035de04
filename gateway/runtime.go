package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/backends/gpuinfo"
	"github.com/kvgate/kvgate/kvbudget"
)

// runtime is everything a configuration turns into. A request loads the
// current runtime once and uses it throughout, so a reload never changes
// the rules under a request in flight; the admission scheduler and the
// backends that survive a reload are the same objects, so held reservations
// and open connections carry over.
type runtime struct {
	cfg    *Config
	models map[string]*model
	// modelOrder is the configured order, for /v1/models.
	modelOrder []string
	// byClientName is each model by the name clients send (its
	// served_name, else its name).
	byClientName map[string]*model
	tenants      map[string]*tenant // by API key
	auth         bool               // keys are required
	classRank    map[string]int     // 0 is the highest priority
	gpus         map[string]*gpu    // by GPU name
	gpuOf        map[*backends.Backend]*gpu
	gpuByID      map[string]*gpu // by id
	// prefixOff are the backends whose shared prompt blocks are never
	// counted once (backends[].prefix_caching: off).
	prefixOff map[*backends.Backend]bool
	// prefixOn are the backends the operator says share prompt blocks
	// (backends[].prefix_caching: on), whatever they report.
	prefixOn  map[*backends.Backend]bool
	upstreams *backends.Pool
	cors      *corsPolicy          // nil: no CORS
	sched     *admission.Scheduler // shared by every runtime of a server
	count     bool                 // admission.mode count: requests, not bytes
	resumes   bool                 // streams the guard stops are resumed (AdmissionConfig.resumes, resume.go)
	// reconciled follows each GPU's memory nobody admitted (reconcile.go);
	// shared by every runtime of a server, so that a reload keeps what it
	// has seen.
	reconciled *reconcilers
}

type tenant struct {
	name  string
	class string
}

// gpu is one GPU (or tensor-parallel group) and its budget, shared by the
// backends that run on it.
type gpu struct {
	name string
	// id names its budget in the scheduler: its own name, or the id of a
	// GPU it replaced on reload (a renamed GPU keeps its reservations).
	id string
	// nominal is the budget from the config (gpu_memory × ceiling − weights
	// − reserve − other), or, in count mode, the concurrency limit.
	nominal int64
	// budgetField names the kv_budget that set nominal ("" when it was
	// computed from gpu_memory): the warning about an oversized pool
	// names the setting to change.
	budgetField string
	backends    []*backends.Backend
	// bytesPerToken of the model each backend serves, on one GPU: with the
	// block size the backend reports, it turns its pool (in blocks) into
	// bytes.
	bytesPerToken map[*backends.Backend]int64
	rr            atomic.Uint64
	// sharing says its backends hold a shared prompt block once, as they
	// last reported (prefix.go).
	sharing atomic.Bool
	// refuted says its backends' prefix-cache hits showed fewer shared
	// blocks than it counted: it shares no more until a reload
	// (sharecheck.go).
	refuted atomic.Bool
	check   shareCheck
}

// reported is what the backends of g report of their KV pools: their total
// size and the part in use, in bytes of one GPU. ok is false until every
// backend of the GPU has reported both.
func (g *gpu) reported() (pool, used int64, ok bool) {
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
// its backends' pools are smaller. (In count mode, the concurrency limit.)
func (g *gpu) capacity(count bool) int64 {
	if count {
		return g.nominal
	}
	if pool, _, ok := g.reported(); ok && pool < g.nominal {
		return pool
	}
	return g.nominal
}

// buildRuntime turns a validated config into a runtime, reusing what prev
// holds for backends that did not change. It has no effect on prev or on
// the scheduler: the returned commit reconfigures the scheduler (or, with
// sched nil, creates it), once everything else is known to be good.
//
// Its steps, in order: the models, the tenants and classes, each GPU's
// memory and weights (gpuSpecs), each GPU's budget, the backends, and the
// scheduler's config; each step that can fail reports every problem it
// finds before the build stops.
func buildRuntime(cfg *Config, prev *runtime, opt *Options, sched *admission.Scheduler) (*runtime, func() (*admission.Scheduler, error), error) {
	b := &runtimeBuild{cfg: cfg, prev: prev, opt: opt, rt: newRuntime(cfg, prev)}
	b.rt.indexTenants(cfg)
	for _, step := range []func() error{b.models, b.gpuSpecs, b.gpus, b.backends} {
		if err := step(); err != nil {
			return nil, nil, err
		}
	}
	acfg := b.admissionConfig()
	if sched == nil {
		// Validate now: the caller creates it in commit.
		if _, err := admission.New(acfg); err != nil {
			return nil, nil, fmt.Errorf("admission: %w", err)
		}
	}
	return b.rt, b.rt.commit(acfg, opt, sched), nil
}

// runtimeBuild is one buildRuntime under way.
type runtimeBuild struct {
	cfg  *Config
	prev *runtime // nil at start
	opt  *Options
	rt   *runtime
	// specs are the GPUs as the backends describe them, by name; order
	// is their names in the config's order.
	specs map[string]*gpuSpec
	order []string
}

// gpuSpec is one GPU as its backends describe it: memory and the models
// whose weights sit on it.
type gpuSpec struct {
	memory, other, explicit int64
	concurrency             int64
	field                   string
	budgetField             string // the kv_budget behind explicit
	weights                 map[string]int64
	urls                    map[string]bool
}

// newRuntime is an empty runtime for cfg, keeping prev's reconciliation.
func newRuntime(cfg *Config, prev *runtime) *runtime {
	rt := &runtime{
		cfg: cfg, models: map[string]*model{}, tenants: map[string]*tenant{},
		classRank: map[string]int{}, gpus: map[string]*gpu{}, gpuOf: map[*backends.Backend]*gpu{},
		prefixOff: map[*backends.Backend]bool{}, prefixOn: map[*backends.Backend]bool{},
		gpuByID: map[string]*gpu{}, count: cfg.Admission.Mode == modeCount, resumes: cfg.Admission.resumes(), cors: newCORSPolicy(cfg.Server.CORS),
		reconciled: &reconcilers{},
	}
	if prev != nil {
		rt.reconciled = prev.reconciled
	}
	return rt
}

// indexTenants ranks the classes and maps each tenant's keys to it.
func (rt *runtime) indexTenants(cfg *Config) {
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
}

// models builds each model, reusing what prev's model of the same name
// has learned.
func (b *runtimeBuild) models() error {
	var errs []error
	rt := b.rt
	for i, mc := range b.cfg.Models {
		var old *model
		if b.prev != nil {
			old = b.prev.models[mc.Name]
		}
		m, err := buildModel(b.cfg, mc, old)
		if err != nil {
			errs = append(errs, fmt.Errorf("models[%d] (%s): %w", i, mc.Name, err))
			continue
		}
		rt.models[mc.Name] = m
		rt.modelOrder = append(rt.modelOrder, mc.Name)
		if rt.byClientName == nil {
			rt.byClientName = map[string]*model{}
		}
		m.servedName = cmp.Or(mc.ServedName, mc.Name)
		rt.byClientName[m.servedName] = m
	}
	return errors.Join(errs...)
}

// gpuSpecs gathers each GPU's memory, other users, explicit budget,
// concurrency and weights from the backends on it.
func (b *runtimeBuild) gpuSpecs() error {
	var errs []error
	b.specs = map[string]*gpuSpec{}
	for i, bc := range b.cfg.Backends {
		f := fmt.Sprintf("backends[%d]", i)
		gs := b.specs[bc.GPU]
		if gs == nil {
			gs = &gpuSpec{weights: map[string]int64{}, urls: map[string]bool{}, field: f}
			b.specs[bc.GPU] = gs
			b.order = append(b.order, bc.GPU)
		}
		gs.concurrency += int64(bc.maxConcurrency(b.cfg.Admission))
		mem, err := gpuMemory(bc.GPUMemory, b.opt.probeGPUs)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.gpu_memory: %w", f, err))
			continue
		}
		if gs.memory != 0 && mem != 0 && mem != gs.memory {
			errs = append(errs, fmt.Errorf("%s.gpu_memory: %s differs from another backend on gpu %q", f, bc.GPUMemory, bc.GPU))
		}
		gs.memory = max(gs.memory, mem)
		gs.other = max(gs.other, bc.OtherUsed.Bytes)
		if bc.KVBudget.Bytes > gs.explicit {
			gs.explicit, gs.budgetField = bc.KVBudget.Bytes, f+".kv_budget"
		}
		gs.urls[bc.URL] = true
		for _, name := range bc.Models {
			gs.weights[name] = b.rt.models[name].weightsPerGPU()
		}
	}
	return errors.Join(errs...)
}

// gpus sizes each GPU's budget: its kv_budget, else what its memory leaves
// the KV cache; in count mode, its backends' concurrency.
func (b *runtimeBuild) gpus() error {
	var errs []error
	rt := b.rt
	for _, name := range b.order {
		gs := b.specs[name]
		capacity := gs.explicit
		if rt.count {
			capacity = gs.concurrency
		} else if capacity == 0 {
			var w int64
			for _, bytes := range gs.weights {
				w += bytes
			}
			a := b.cfg.Admission
			kv, err := kvbudget.GPUBudget{Memory: gs.memory, Ceiling: a.Ceiling, Weights: w, Reserve: a.Reserve.Bytes, OtherUsed: gs.other}.KVBytes()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: gpu %q: %w", gs.field, name, err))
				continue
			}
			capacity = kv
		}
		g := &gpu{name: name, id: b.carried(name, gs.urls), nominal: capacity, bytesPerToken: map[*backends.Backend]int64{}}
		if !rt.count {
			g.budgetField = gs.budgetField
		}
		rt.gpus[name] = g
		rt.gpuByID[g.id] = g
	}
	return errors.Join(errs...)
}

// carried is the budget a GPU carries over: its own under the same name,
// or, for a renamed GPU (a backend renamed without an explicit gpu), the
// budget of a vanished GPU whose backends it keeps — a new empty budget
// there would admit a second full budget next to the streams still
// running.
func (b *runtimeBuild) carried(name string, urls map[string]bool) string {
	if b.prev == nil {
		return name
	}
	if g := b.prev.gpus[name]; g != nil {
		return g.id
	}
	for oldName, g := range b.prev.gpus {
		if b.specs[oldName] != nil {
			continue
		}
		for _, be := range g.backends {
			if urls[be.Spec().URL] {
				return g.id
			}
		}
	}
	return name
}

// backends makes each backend, or keeps prev's where its spec and GPU are
// unchanged, and puts it on its GPU.
func (b *runtimeBuild) backends() error {
	var errs []error
	var list []*backends.Backend
	rt := b.rt
	for i, bc := range b.cfg.Backends {
		g := rt.gpus[bc.GPU]
		be, err := b.backend(bc, g)
		if err != nil {
			errs = append(errs, fmt.Errorf("backends[%d]: %w", i, err))
			continue
		}
		list = append(list, be)
		rt.gpuOf[be] = g
		switch bc.PrefixCaching {
		case prefixCachingOff:
			rt.prefixOff[be] = true
		case prefixCachingOn:
			rt.prefixOn[be] = true
		}
		g.backends = append(g.backends, be)
		g.bytesPerToken[be] = rt.models[bc.Models[0]].layout.BytesPerToken
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	rt.upstreams = backends.NewPool(list)
	return nil
}

// backend is prev's backend of bc's name on the same budget and with the
// same spec, else a new one.
func (b *runtimeBuild) backend(bc BackendConfig, g *gpu) (*backends.Backend, error) {
	spec := backendSpec(bc)
	var be *backends.Backend
	if b.prev != nil {
		for _, old := range b.prev.upstreams.Backends() {
			if old.Name() == bc.Name && b.prev.gpuOf[old].id == g.id && sameSpec(old.Spec(), spec) {
				be = old
			}
		}
	}
	if be != nil {
		return be, nil
	}
	return backends.NewBackend(spec, gpuBudget{rt: b.rt, id: g.id}, b.opt.Clock)
}

// admissionConfig is the scheduler's config: the admission section, each
// GPU's budget and each model's queue over the GPUs that serve it.
func (b *runtimeBuild) admissionConfig() admission.Config {
	rt := b.rt
	acfg := admissionConfig(b.cfg, b.opt)
	for _, name := range b.order {
		g := rt.gpus[name]
		// Keep the clamp to the KV pools the backends reported: reconfiguring to
		// the configured size would admit past them until the next scrape.
		acfg.GPUs = append(acfg.GPUs, admission.GPUConfig{Name: g.id, Capacity: g.capacity(rt.count)})
	}
	for _, name := range rt.modelOrder {
		q := admission.QueueConfig{Name: name, MaxLen: rt.models[name].maxLen}
		for _, gname := range b.order {
			g := rt.gpus[gname]
			for _, be := range g.backends {
				if be.Serves(name) && !slices.Contains(q.GPUs, g.id) {
					q.GPUs = append(q.GPUs, g.id)
				}
			}
		}
		acfg.Queues = append(acfg.Queues, q)
	}
	return acfg
}

// commit is buildRuntime's commit: it creates the scheduler (sched nil)
// or reconfigures it with acfg, then gives it to rt.
func (rt *runtime) commit(acfg admission.Config, opt *Options, sched *admission.Scheduler) func() (*admission.Scheduler, error) {
	return func() (*admission.Scheduler, error) {
		if sched == nil {
			acfg.Observer = opt.observer()
			acfg.OnDemand = opt.onDemand
			var err error
			sched, err = admission.New(acfg)
			if err != nil {
				return nil, err
			}
		} else if err := sched.Reconfigure(acfg); err != nil {
			return nil, err
		}
		rt.sched = sched
		rt.syncRoutes()
		return sched, nil
	}
}

// gpuBudget is a backend's view of its GPU's budget, for routing its
// tokenize calls (backends.Pool.Pick) to the one with the most room.
type gpuBudget struct {
	rt *runtime
	id string
}

func (b gpuBudget) Free() int64 {
	if b.rt.sched == nil {
		return 0
	}
	return b.rt.sched.Free(b.id)
}

// syncRoutes tells the scheduler which GPUs may take each model's requests
// now: those with an available backend serving it. Called after every probe
// and every upstream failure, it is how a backend whose circuit opens stops
// taking binds and strands none of its model's waiters.
func (rt *runtime) syncRoutes() {
	for _, g := range rt.gpus {
		for _, name := range rt.modelOrder {
			serves, up := false, false
			for _, be := range g.backends {
				if be.Serves(name) {
					serves = true
					up = up || be.Available()
				}
			}
			if serves {
				// Only an unknown queue or GPU fails, and both are
				// this runtime's own: nothing to report.
				_ = rt.sched.SetAvailable(name, g.id, up)
			}
		}
	}
}

// sameSpec says whether a backend made from b would be the backend a
// already is; only then is it reused across a reload.
func sameSpec(a, b backends.Spec) bool { return reflect.DeepEqual(a, b.WithDefaults()) }

func backendSpec(bc BackendConfig) backends.Spec {
	return backends.Spec{
		Name: bc.Name, URL: bc.URL, Models: bc.Models, APIKey: bc.APIKey, TLS: bc.tlsSpec(),
		HealthPath: bc.Health.Path, HealthInterval: bc.Health.Interval.D, HealthTimeout: bc.Health.Timeout.D,
		FailThreshold: bc.Health.Failures, Cooldown: bc.Health.Cooldown.D,
		MetricsPath: bc.Scrape.Path, ScrapeInterval: bc.Scrape.Interval.D,
		FirstByteTimeout: bc.FirstByteTimeout.D, TokenizeTimeout: bc.TokenizeTimeout.D,
		FinalUsageOnly: bc.StreamUsage == streamUsageFinal,
		Upstream:       backends.UpstreamOptions{MaxConns: bc.MaxConnections},
	}
}

// queueingOff names the setting that makes class never queue (a negative
// max_requests, the class's own or admission.queue's), or "" if it queues.
func (c *Config) queueingOff(class string) string {
	for i, cl := range c.Admission.Classes {
		switch {
		case cl.Name != class:
		case cl.MaxQueued < 0:
			return fmt.Sprintf("admission.classes[%d].max_requests", i)
		case cl.MaxQueued == 0 && c.Admission.Queue.MaxQueued < 0:
			return "admission.queue.max_requests"
		}
	}
	return ""
}

// admissionConfig maps the gateway's admission section onto the
// scheduler's config (GPUs and queues are the caller's). Classes, their
// defaults (admission.queue), tenants' shares and backfill are admission's
// own types and pass as they are.
func admissionConfig(cfg *Config, opt *Options) admission.Config {
	a := cfg.Admission
	classDefaults := a.Queue
	reservation := a.Reservation
	if a.Mode == modeCount {
		reservation = admission.WorstCase // a request is one slot, whatever it generates
		if classDefaults.MaxQueuedBytes.Bytes == 0 {
			classDefaults.MaxQueuedBytes.Bytes = -1 // weights are requests: max_requests bounds them
		}
	}
	var tenants []admission.TenantConfig
	for _, t := range cfg.Tenants {
		tenants = append(tenants, t.TenantConfig)
	}
	headroom := 0.0 // admission's default
	if a.Headroom != nil {
		if headroom = *a.Headroom; headroom == 0 {
			headroom = -1 // an explicit 0 in the gateway's config means none
		}
	}
	return admission.Config{
		Limited: cfg.SharedBudget != nil, // a replica admits nothing before its lease is known
		Classes: a.Classes, ClassDefaults: classDefaults, DefaultClass: a.DefaultClass, Tenants: tenants,
		DefaultTenantShare: a.DefaultTenantShare, PressureThreshold: a.Pressure,
		DrainWindow: a.DrainWindow.D, MaxRetryAfter: a.MaxRetryAfter.D, Clock: opt.Clock,
		AIMD: admission.AIMDConfig{Decrease: a.Feedback.Decrease, Increase: a.Feedback.Increase, MinFraction: a.Feedback.MinFraction},
		Policy: admission.PolicyConfig{Reservation: reservation, Epsilon: a.Epsilon, ResumableEpsilon: a.ResumableEpsilon, WarmupSamples: a.WarmupSamples, Headroom: headroom,
			MaxOvercommit: a.MaxOvercommit, CoolDown: a.CoolDown.D},
		Backfill: a.Backfill, Preemption: a.Preemption,
	}
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
