package admission

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvgate/kvgate/internal/confval"
)

// Defaults that zero values in Config stand for.
const (
	DefaultMaxQueued          = 1024
	DefaultQueuedBytesFactor  = 16 // MaxQueuedBytes 0 = this many times the capacity of the queue's GPUs: a burst of 10× what fits queues
	DefaultQueueTimeout       = 30 * time.Second
	DefaultPressureThreshold  = 0.9
	DefaultShare              = 1.0 // DefaultTenantShare 0 = this: no cap beyond the capacity itself
	DefaultDrainWindow        = 10 * time.Second
	DefaultMaxRetryAfter      = 60 * time.Second
	MinRetryAfter             = time.Second // Retry-After is whole seconds on the wire
	DefaultAIMDDecrease       = 0.9
	DefaultAIMDIncrease       = 0.01
	DefaultAIMDMinFraction    = 0.25
	DefaultEpsilon            = 1e-4
	DefaultResumableEpsilon   = 3e-2
	DefaultWarmupSamples      = 100
	DefaultHeadroom           = 0.02
	DefaultMaxHeadAge         = 10 * time.Second
	DefaultPreemptAfter       = 200 * time.Millisecond
	DefaultMaxOvercommit      = 4.0
	DefaultCoolDown           = 30 * time.Second
	defaultClassPreferredName = "standard"
	sheddableClassName        = "sheddable" // sheddable unless it says otherwise
)

// Reservation policies (Config.Policy.Reservation).
const (
	// WorstCase holds every request's largest possible size (Request.Weight)
	// from admission to release: the sum of what is held never exceeds the
	// capacity, so a backend can never overflow.
	WorstCase = "worst_case"
	// Predicted admits while the peak of the GPU's predicted future memory
	// curve fits, with overflow probability bounded by Policy.Epsilon; see
	// doc.go. Requests without a Shape, and queues with fewer than
	// Policy.WarmupSamples finished sequences, are held at their worst case.
	Predicted = "predicted"
)

// ClassConfig is one priority class. Classes are listed highest priority
// first. Every queue has one line per class. The yaml tags are the keys of
// the gateway's admission.classes.
type ClassConfig struct {
	Name string `yaml:"name"` // unique, non-empty
	// ClassLimits bound the class's line in each queue; a zero limit takes
	// Config.ClassDefaults'.
	ClassLimits `yaml:",inline"`
	// Sheddable requests are refused with ErrOverloaded while every GPU
	// that could serve them is above Config.PressureThreshold. nil = true
	// for a class named sheddable, false for any other (IsSheddable).
	Sheddable *bool `yaml:"sheddable"`
}

// IsSheddable is the resolved Sheddable.
func (c ClassConfig) IsSheddable() bool {
	if c.Sheddable == nil {
		return c.Name == sheddableClassName
	}
	return *c.Sheddable
}

// ClassLimits bound the waiting requests of one class in one queue: a
// class's own (ClassConfig), or the defaults of every class
// (Config.ClassDefaults, the gateway's admission.queue).
type ClassLimits struct {
	// MaxQueued bounds how many requests of this class may wait at once in
	// one queue. 0 = the default's, else DefaultMaxQueued (1024); negative =
	// never queue: a request that does not fit at once is refused with
	// ErrQueueFull.
	MaxQueued int `yaml:"max_requests"`
	// MaxQueuedBytes bounds the summed weight of the waiting requests of this
	// class in one queue. 0 = the default's, else DefaultQueuedBytesFactor
	// (16) × the nominal capacity of the queue's GPUs, following Resize;
	// negative = no bound in bytes (MaxQueued still applies).
	MaxQueuedBytes confval.Size `yaml:"max_bytes"`
	// QueueTimeout is the longest a request of this class waits. 0 = the
	// default's, else DefaultQueueTimeout (30s); negative = no class limit
	// (only the request's own Deadline and its context end the wait).
	QueueTimeout confval.Duration `yaml:"timeout"`
}

// TenantConfig bounds one tenant. The yaml tags are keys of the gateway's
// tenants, which add the tenant's keys and class.
type TenantConfig struct {
	Name string `yaml:"name"` // unique, non-empty ("" is the anonymous tenant, see DefaultTenantShare)
	// Share is the largest fraction of each GPU's nominal capacity the
	// tenant may hold at once, in (0,1]. 0 = Config.DefaultTenantShare.
	Share float64 `yaml:"share"`
	// QueueShare is the largest fraction of each class line (both count and
	// bytes, rounded up) the tenant may occupy, in (0,1]. 0 = Share.
	QueueShare float64 `yaml:"queue_share"`
}

// AIMDConfig shapes the closed loop driven by Scheduler.Feedback. A GPU's
// effective capacity starts at its nominal one.
type AIMDConfig struct {
	// Decrease multiplies the effective capacity on each Feedback(true),
	// in (0,1). 0 = DefaultAIMDDecrease (0.9).
	Decrease float64
	// Increase is the fraction of the nominal capacity added back on each
	// Feedback(false), never above nominal, in (0,1]. 0 = DefaultAIMDIncrease (0.01).
	Increase float64
	// MinFraction is the floor of the effective capacity as a fraction of the
	// nominal one, in (0,1]. 0 = DefaultAIMDMinFraction (0.25).
	MinFraction float64
}

// PolicyConfig chooses how much a running request is taken to hold.
type PolicyConfig struct {
	// Reservation is WorstCase or Predicted. "" = WorstCase.
	Reservation string
	// Epsilon bounds the probability that a GPU's real use passes its
	// capacity, per admission decision, under Predicted. In (0, 0.5).
	// 0 = DefaultEpsilon (1e-4).
	Epsilon float64
	// ResumableEpsilon is Epsilon for a request the guard can stop and
	// resume (a ResumableStopper that says so, not NoResume): what its
	// bound risks is a pause and the recompute of its tokens, never an
	// error, since the guard stops such requests first and the worst cases
	// of those it cannot resume fit within the line without them. A guard
	// stop of such requests alone distrusts no forecast (the change
	// detector judges those). In (0, 0.5); never tighter than Epsilon.
	// 0 = DefaultResumableEpsilon (3e-2).
	ResumableEpsilon float64
	// WarmupSamples is how many finished sequences a queue (or a tenant in
	// it) must have reported before its requests are predicted rather than
	// held at their worst case. 0 = DefaultWarmupSamples (100); negative =
	// predict from the first sample.
	WarmupSamples int
	// Headroom: while a GPU's backend reports more than (1 − Headroom) ×
	// its effective capacity in use, nothing new is admitted to it, whatever
	// the forecast says (a request whose worst case fits beside everything
	// held excepted, on a GPU without a limit). In [0, 0.5). 0 = DefaultHeadroom (0.02); negative =
	// no headroom gate.
	Headroom float64
	// MaxOvercommit bounds the exposure of a GPU to a wrong forecast: the
	// sum of the worst cases of what it holds never exceeds MaxOvercommit ×
	// its capacity, and a tenant's sum never exceeds that times its share,
	// so that a tenant's flood of requests that turn out long cannot take
	// the memory another tenant's running requests grow into. >= 1.
	// 0 = DefaultMaxOvercommit (4).
	MaxOvercommit float64
	// CoolDown is how long requests are held at their worst case after
	// their forecast was found wrong: a tenant's or a class's when the
	// change detector tripped on it, a queue's when the guard had to stop a
	// request or a backend overflowed; the learned lengths of what was
	// distrusted start over, so warm-up follows. 0 = DefaultCoolDown (30s);
	// negative = no cool-down (warm-up alone).
	CoolDown time.Duration
}

// GPUConfig is one budget: one GPU (or tensor-parallel group), in weight
// units (bytes of KV cache).
type GPUConfig struct {
	Name     string // unique, non-empty
	Capacity int64  // nominal capacity; > 0
}

// QueueConfig is one line of waiting requests (the gateway keeps one per
// model) and the GPUs that may serve it.
type QueueConfig struct {
	Name string   // unique ("" is allowed: a single-queue scheduler)
	GPUs []string // names from Config.GPUs; at least one
	// MaxLen is the longest output a sequence of this queue can have
	// (the model's context length), the range of its learned lengths.
	// 0 = 1<<17.
	MaxLen int
}

// Config is a scheduler's configuration. The zero value of every field but
// GPUs and Queues is usable.
type Config struct {
	GPUs   []GPUConfig
	Queues []QueueConfig
	// Classes, highest priority first. Empty = DefaultClasses().
	Classes []ClassConfig
	// ClassDefaults are the limits of every class that does not set its
	// own. Zero = each limit's own default (ClassLimits).
	ClassDefaults ClassLimits
	// DefaultClass is the class of a Request with Class "". "" =
	// DefaultClass(Classes).
	DefaultClass string
	Tenants      []TenantConfig
	// DefaultTenantShare is the share of every tenant not listed in Tenants,
	// each on its own, including the anonymous tenant "", in (0,1].
	// 0 = DefaultShare (1.0: no cap beyond the capacity itself).
	DefaultTenantShare float64
	// PressureThreshold is the utilization (committed / effective capacity)
	// above which Sheddable classes are refused, in (0,1]. 0 = 0.9.
	PressureThreshold float64
	// DrainWindow is how far back the release rate is measured. 0 = 10s.
	DrainWindow time.Duration
	// MaxRetryAfter caps RejectError.RetryAfter (which is never below
	// MinRetryAfter, 1s, when retrying can help). 0 = 60s; must be >= 1s.
	MaxRetryAfter time.Duration
	AIMD          AIMDConfig
	Policy        PolicyConfig
	Backfill      BackfillConfig
	Preemption    PreemptionConfig
	// Clock is the source of time. nil = SystemClock(). Fixed at New:
	// Reconfigure ignores it.
	Clock Clock
	// Observer receives every admission and refusal. nil = none. Fixed at
	// New: Reconfigure ignores it.
	Observer Observer
	// Seed seeds the jitter of Retry-After. 0 = a fixed seed.
	Seed uint64
	// Limited starts every GPU (at New, and each one Reconfigure adds) with
	// a limit of 0 instead of none, so that nothing is admitted to it until
	// SetLimit opens it: the GPU of a budget shared with other processes
	// must not admit a whole budget of its own before its share is known.
	// Fixed at New: Reconfigure ignores it. See limit.go.
	Limited bool
	// OnDemand, if set, is called with a GPU's name when a request queues
	// for lack of room on it and when weight held on it is given back: the
	// moments an external limiter (SetLimit) may want to grow or shrink. It
	// is called after the scheduler's lock is released, from the goroutine
	// that caused it (a request's), so it must return at once (a
	// non-blocking channel send). Fixed at New: Reconfigure ignores it.
	OnDemand func(gpu string)
}

// DefaultClasses are critical, standard and sheddable, in that order.
func DefaultClasses() []ClassConfig {
	return []ClassConfig{
		{Name: "critical", ClassLimits: ClassLimits{MaxQueued: DefaultMaxQueued, QueueTimeout: confval.Duration{D: 60 * time.Second}}},
		{Name: "standard", ClassLimits: ClassLimits{MaxQueued: DefaultMaxQueued, QueueTimeout: confval.Duration{D: DefaultQueueTimeout}}},
		{Name: sheddableClassName, ClassLimits: ClassLimits{MaxQueued: DefaultMaxQueued, QueueTimeout: confval.Duration{D: 10 * time.Second}}},
	}
}

// DefaultClass is the class of requests that name none when no default
// class is configured: standard if there is such a class, else the middle
// one of classes (of DefaultClasses() if there are none).
func DefaultClass(classes []ClassConfig) string {
	if len(classes) == 0 {
		classes = DefaultClasses()
	}
	for _, c := range classes {
		if c.Name == defaultClassPreferredName {
			return c.Name
		}
	}
	return classes[len(classes)/2].Name
}

// classSpec is a ClassConfig with defaults filled in.
type classSpec struct {
	name           string
	maxQueued      int           // < 0: never queue
	maxQueuedBytes int64         // 0: DefaultQueuedBytesFactor × nominal; < 0: unbounded
	timeout        time.Duration // <= 0: none
	sheddable      bool
}

type tenantSpec struct{ share, queueShare float64 }

type aimdSpec struct{ decrease, increase, minFraction float64 }

type policySpec struct {
	predicted  bool
	epsilon    float64
	z          float64 // the normal quantile of 1 − epsilon
	zResumable float64 // the same for a request the guard can stop and resume
	warmup     float64
	headroom   float64 // 0: no gate
	overcommit float64
	coolDown   time.Duration // <= 0: none
}

type queueSpec struct {
	name   string
	gpus   []string
	maxLen int
}

// settings is a validated Config with every default filled in.
type settings struct {
	gpus          []GPUConfig
	queues        []queueSpec
	classes       []classSpec
	defaultClass  int
	tenants       map[string]tenantSpec
	defaultShare  float64
	pressure      float64
	drainWindow   time.Duration
	maxRetryAfter time.Duration
	aimd          aimdSpec
	policy        policySpec
	backfill      bool
	preemption    bool
	preemptAfter  time.Duration
	maxHeadAge    time.Duration // <= 0: none
}

// fraction checks a value documented as "in (0,1], 0 = default".
func fraction(field string, v, def float64, openTop bool) (float64, error) {
	if v == 0 {
		return def, nil
	}
	if math.IsNaN(v) || v < 0 || v > 1 || (openTop && v == 1) {
		interval := "(0,1]"
		if openTop {
			interval = "(0,1)"
		}
		return 0, fmt.Errorf("%s: %v is not in %s (0 = default %v)", field, v, interval, def)
	}
	return v, nil
}

// resolver collects every problem of a Config while its parts resolve,
// each prefixed by the field's name.
type resolver struct{ errs []error }

// bad records err, if any.
func (r *resolver) bad(err error) {
	if err != nil {
		r.errs = append(r.errs, err)
	}
}

func (r *resolver) badf(format string, a ...any) { r.errs = append(r.errs, fmt.Errorf(format, a...)) }

// fraction resolves a value documented as "in (0,1], 0 = default".
func (r *resolver) fraction(field string, v, def float64, openTop bool) float64 {
	f, err := fraction(field, v, def, openTop)
	r.bad(err)
	return f
}

// resolve validates cfg and fills its defaults. Every problem is reported,
// each prefixed by the field's name.
func resolve(cfg Config) (settings, error) {
	var r resolver
	var s settings
	var gpuSeen map[string]int
	s.gpus, gpuSeen = r.gpus(cfg.GPUs)
	s.queues = r.queues(cfg.Queues, gpuSeen)
	s.classes, s.defaultClass = r.classes(cfg)
	s.defaultShare, s.tenants = r.tenants(cfg)
	s.pressure = r.fraction("pressure_threshold", cfg.PressureThreshold, DefaultPressureThreshold, false)
	s.drainWindow, s.maxRetryAfter = r.retryAfter(cfg)
	s.aimd = r.aimd(cfg.AIMD)
	s.policy = r.policy(cfg.Policy)
	s.backfill, s.maxHeadAge = resolveBackfill(cfg.Backfill)
	s.preemption, s.preemptAfter = resolvePreemption(cfg.Preemption)
	if len(r.errs) > 0 {
		return settings{}, fmt.Errorf("admission: invalid config: %w", errors.Join(r.errs...))
	}
	return s, nil
}

// gpus checks the budgets; it returns them and their indices by name.
func (r *resolver) gpus(gpus []GPUConfig) ([]GPUConfig, map[string]int) {
	if len(gpus) == 0 {
		r.badf("GPUs: at least one GPU is required")
	}
	var out []GPUConfig
	seen := make(map[string]int, len(gpus))
	for i, p := range gpus {
		switch j, dup := seen[p.Name]; {
		case p.Name == "":
			r.badf("GPUs[%d].name: must not be empty", i)
		case dup:
			r.badf("GPUs[%d].name: %q already names GPUs[%d]", i, p.Name, j)
		}
		seen[p.Name] = i
		if p.Capacity <= 0 {
			r.badf("GPUs[%d].capacity: %d must be > 0", i, p.Capacity)
		}
		out = append(out, p)
	}
	return out, seen
}

// defaultMaxLen is a queue's MaxLen when it gives none.
const defaultMaxLen = 1 << 17

// queues checks the queues against the budgets (GPUs, by name).
func (r *resolver) queues(queues []QueueConfig, gpus map[string]int) []queueSpec {
	if len(queues) == 0 {
		r.badf("queues: at least one queue is required")
	}
	var out []queueSpec
	seen := make(map[string]int, len(queues))
	for i, q := range queues {
		if j, dup := seen[q.Name]; dup {
			r.badf("queues[%d].name: %q already names queues[%d]", i, q.Name, j)
		}
		seen[q.Name] = i
		r.queueGPUs(i, q.GPUs, gpus)
		qs := queueSpec{name: q.Name, gpus: append([]string(nil), q.GPUs...), maxLen: q.MaxLen}
		switch {
		case qs.maxLen == 0:
			qs.maxLen = defaultMaxLen
		case qs.maxLen < 0:
			r.badf("queues[%d].max_len: %d must be > 0 (0 = default %d)", i, q.MaxLen, defaultMaxLen)
		}
		out = append(out, qs)
	}
	return out
}

// queuePools checks queue i's list of budgets: known ones, each once.
func (r *resolver) queueGPUs(i int, list []string, gpus map[string]int) {
	if len(list) == 0 {
		r.badf("queues[%d].GPUs: at least one GPU is required", i)
	}
	seen := map[string]bool{}
	for j, p := range list {
		if _, ok := gpus[p]; !ok {
			r.badf("queues[%d].GPUs[%d]: %q is not one of the GPUs", i, j, p)
		}
		if seen[p] {
			r.badf("queues[%d].GPUs[%d]: %q is listed twice", i, j, p)
		}
		seen[p] = true
	}
}

// classes resolves the classes (DefaultClasses when none), each limit
// from the class's own, else ClassDefaults', else the package's, and the
// index of the default class.
func (r *resolver) classes(cfg Config) ([]classSpec, int) {
	classes := cfg.Classes
	if len(classes) == 0 {
		classes = DefaultClasses()
	}
	var out []classSpec
	seen := make(map[string]int, len(classes))
	d := cfg.ClassDefaults
	for i, c := range classes {
		if c.Name == "" {
			r.badf("classes[%d].name: must not be empty", i)
		} else if j, dup := seen[c.Name]; dup {
			r.badf("classes[%d].name: %q already names classes[%d]", i, c.Name, j)
		}
		seen[c.Name] = i
		out = append(out, classSpec{name: c.Name, sheddable: c.IsSheddable(),
			maxQueued:      cmp.Or(c.MaxQueued, d.MaxQueued, DefaultMaxQueued),
			maxQueuedBytes: cmp.Or(c.MaxQueuedBytes.Bytes, d.MaxQueuedBytes.Bytes),
			timeout:        cmp.Or(c.QueueTimeout.D, d.QueueTimeout.D, DefaultQueueTimeout)})
	}
	switch i, ok := seen[cfg.DefaultClass]; {
	case cfg.DefaultClass != "" && !ok:
		r.badf("default_class: %q is not one of the classes", cfg.DefaultClass)
		return out, 0
	case cfg.DefaultClass != "":
		return out, i
	default:
		return out, seen[DefaultClass(classes)]
	}
}

// tenants resolves the share of unlisted tenants and each listed one's.
func (r *resolver) tenants(cfg Config) (float64, map[string]tenantSpec) {
	def := r.fraction("default_tenant_share", cfg.DefaultTenantShare, DefaultShare, false)
	out := make(map[string]tenantSpec, len(cfg.Tenants))
	for i, t := range cfg.Tenants {
		field := fmt.Sprintf("tenants[%d]", i)
		if t.Name == "" {
			r.badf("%s.name: must not be empty (the anonymous tenant takes default_tenant_share)", field)
		} else if _, dup := out[t.Name]; dup {
			r.badf("%s.name: tenant %q is listed twice", field, t.Name)
		}
		share := r.fraction(field+".share", t.Share, def, false)
		out[t.Name] = tenantSpec{share: share, queueShare: r.fraction(field+".queue_share", t.QueueShare, share, false)}
	}
	return def, out
}

// retryAfter resolves the drain window and the cap of Retry-After.
func (r *resolver) retryAfter(cfg Config) (window, maxRetryAfter time.Duration) {
	switch window = cfg.DrainWindow; {
	case window == 0:
		window = DefaultDrainWindow
	case window < drainBuckets*time.Millisecond:
		r.badf("drain_window: %v must be >= %v (0 = default %v)", cfg.DrainWindow, drainBuckets*time.Millisecond, DefaultDrainWindow)
	}
	switch maxRetryAfter = cfg.MaxRetryAfter; {
	case maxRetryAfter == 0:
		maxRetryAfter = DefaultMaxRetryAfter
	case maxRetryAfter < MinRetryAfter:
		r.badf("max_retry_after: %v must be >= %v (0 = default %v)", cfg.MaxRetryAfter, MinRetryAfter, DefaultMaxRetryAfter)
	}
	return window, maxRetryAfter
}

func (r *resolver) aimd(a AIMDConfig) aimdSpec {
	return aimdSpec{
		decrease:    r.fraction("aimd.decrease", a.Decrease, DefaultAIMDDecrease, true),
		increase:    r.fraction("aimd.increase", a.Increase, DefaultAIMDIncrease, false),
		minFraction: r.fraction("aimd.min_fraction", a.MinFraction, DefaultAIMDMinFraction, false),
	}
}

// policy resolves the reservation policy: its forecast's parameters, then
// the bounds on what a wrong forecast costs.
func (r *resolver) policy(p PolicyConfig) policySpec {
	var s policySpec
	switch p.Reservation {
	case "", WorstCase:
	case Predicted:
		s.predicted = true
	default:
		r.badf("policy.reservation: %q is not %s or %s", p.Reservation, WorstCase, Predicted)
	}
	switch s.epsilon = p.Epsilon; {
	case s.epsilon == 0:
		s.epsilon = DefaultEpsilon
	case math.IsNaN(p.Epsilon) || p.Epsilon <= 0 || p.Epsilon >= 0.5:
		r.badf("policy.epsilon: %v is not in (0, 0.5) (0 = default %v)", p.Epsilon, DefaultEpsilon)
	}
	s.z = normalQuantile(1 - s.epsilon)
	eps := p.ResumableEpsilon
	switch {
	case eps == 0:
		eps = DefaultResumableEpsilon
	case math.IsNaN(eps) || eps <= 0 || eps >= 0.5:
		r.badf("policy.resumable_epsilon: %v is not in (0, 0.5) (0 = default %v)", eps, DefaultResumableEpsilon)
		eps = DefaultResumableEpsilon
	}
	s.zResumable = normalQuantile(1 - max(eps, s.epsilon))
	switch {
	case p.WarmupSamples == 0:
		s.warmup = DefaultWarmupSamples
	case p.WarmupSamples > 0:
		s.warmup = float64(p.WarmupSamples)
	}
	s.headroom, s.overcommit, s.coolDown = r.exposure(p)
	return s
}

// exposure resolves the policy's headroom gate, overcommit bound and
// cool-down.
func (r *resolver) exposure(p PolicyConfig) (headroom, overcommit float64, coolDown time.Duration) {
	switch {
	case p.Headroom == 0:
		headroom = DefaultHeadroom
	case p.Headroom < 0:
	case math.IsNaN(p.Headroom) || p.Headroom >= 0.5:
		r.badf("policy.headroom: %v is not in [0, 0.5) (0 = default %v, negative = none)", p.Headroom, DefaultHeadroom)
	default:
		headroom = p.Headroom
	}
	switch {
	case p.MaxOvercommit == 0:
		overcommit = DefaultMaxOvercommit
	case math.IsNaN(p.MaxOvercommit) || p.MaxOvercommit < 1:
		r.badf("policy.max_overcommit: %v must be >= 1 (0 = default %v)", p.MaxOvercommit, DefaultMaxOvercommit)
	default:
		overcommit = p.MaxOvercommit
	}
	switch coolDown = p.CoolDown; {
	case p.CoolDown == 0:
		coolDown = DefaultCoolDown
	case p.CoolDown < 0:
		coolDown = 0
	}
	return headroom, overcommit, coolDown
}

// normalQuantile is Φ⁻¹(p), the standard normal quantile, for p in (0,1).
func normalQuantile(p float64) float64 { return math.Sqrt2 * math.Erfinv(2*p-1) }
