package gateway

import (
	"cmp"
	"fmt"
	"math"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// Admission modes (AdmissionConfig.Mode).
const (
	modeKV    = "kv"    // admit by predicted KV bytes against each GPU's budget
	modeCount = "count" // admit up to max_concurrency requests per backend, as a plain concurrency limit does
)

// AdmissionConfig is the KV budget policy.
type AdmissionConfig struct {
	// Mode is kv (requests are admitted by their KV bytes against each
	// GPU's budget) or count (at most max_concurrency requests per backend,
	// whatever their size: the fixed limit a plain proxy gives, kept for
	// comparison). Default kv.
	Mode string `yaml:"mode"`
	// MaxConcurrency is each backend's limit in count mode (a backend may
	// set its own). Default 16.
	MaxConcurrency int `yaml:"max_concurrency"`
	// Reservation is how much a running request is taken to hold:
	// predicted (its prompt and what it has generated, plus its growth as
	// forecast from the output lengths this model's requests really had, so
	// that the batch's future peak stays within the budget but with
	// probability epsilon; when the forecast is wrong the guard stops, and
	// resumes, streams before the GPU overflows) or worst_case (prompt +
	// max_tokens from admission to release: overflow is impossible, most of
	// the pool stays reserved but empty). Default predicted.
	Reservation string `yaml:"reservation"`
	// Epsilon bounds the probability that a GPU's real KV use passes its
	// budget, per admission, under predicted. In (0, 0.5). Default 1e-4.
	Epsilon float64 `yaml:"epsilon"`
	// ResumableEpsilon is epsilon for a stream the guard can stop and
	// resume (resume_stopped): what its bound risks is a pause and a
	// recompute, never an error, and such a stop distrusts no forecast.
	// In (0, 0.5), never tighter than epsilon. Default 3e-2.
	ResumableEpsilon float64 `yaml:"resumable_epsilon"`
	// WarmupSamples is how many finished sequences a model (or a tenant of
	// it) must have before its requests are predicted; until then they are
	// held at their worst case. Default 100; negative: from the first.
	WarmupSamples int `yaml:"warmup_samples"`
	// Headroom: while a backend reports more than (1 − headroom) × its
	// budget in use, nothing new is admitted to its GPU on the forecast
	// alone (predicted only; a request whose worst case fits beside
	// everything held still is).
	// In [0, 0.5); 0 disables the gate. Default 0.02.
	Headroom *float64 `yaml:"headroom"`
	// MaxOvercommit bounds what a wrong forecast can cost (predicted
	// only): the worst cases (prompt + max_tokens) of the requests admitted
	// to a GPU never sum past max_overcommit × its budget, nor a tenant's
	// past that times its share. >= 1. Default 4.
	MaxOvercommit float64 `yaml:"max_overcommit"`
	// CoolDown is how long a model's requests are held at their worst case
	// once its forecast has been shown wrong (its running requests outlived
	// it, a stream had to be stopped to keep the GPU within budget, or a
	// backend ran out of memory or preempted); its learned lengths start
	// over, so the warm-up follows. Default 30s; negative: none.
	CoolDown Duration `yaml:"cool_down"`
	// AbortHold is how long a request's reservation stays held after the
	// gateway ended its exchange with the backend early (the client hung
	// up, a timeout, a stop): the backend holds its blocks until it notices
	// the abort, and admitting into them would overflow it. Default 1s; 0:
	// released at once.
	AbortHold Duration `yaml:"abort_hold"`
	// LengthsFile keeps what the gateway learned of each model's output
	// lengths across restarts (lengthsfile.go), for a gateway without
	// shared_budget (a fleet keeps them in Redis). Off by default.
	LengthsFile LengthsFileConfig `yaml:"lengths_file"`
	// ResumeStopped: a stream the guard stops is resumed rather than cut
	// (predicted only). Its exchange with the backend ends, so its blocks
	// go back, and the gateway sends it again once it fits, at its place in
	// the queue and held at its worst case: the prompt followed by what it
	// had generated, to go on from there (vLLM's continue_final_message
	// for chat, the text appended to the prompt for completions), as vLLM
	// recomputes a sequence it preempted. The client's stream pauses and
	// goes on. Requests that cannot be continued that way (several
	// choices, structured output, echo, a prompt of token ids, tool calls)
	// are still cut. Default true.
	ResumeStopped *bool `yaml:"resume_stopped"`
	// Backfill lets requests that fit start past a head request that does
	// not, while that does not delay the head.
	// Its fields and defaults are admission.BackfillConfig's.
	Backfill admission.BackfillConfig `yaml:"backfill"`
	// Preemption lets a request of a higher class that has waited
	// preemption.after and still fits nowhere start on room that streams
	// of lower classes hold, where the guard can take it back: it stops
	// those streams (resumed as resume_stopped resumes them) if their
	// growth then meets the GPU's budget, as vLLM's priority scheduling
	// preempts (predicted only; never on a GPU of a shared_budget, whose
	// lease is a hard limit). Its fields and defaults are
	// admission.PreemptionConfig's.
	Preemption admission.PreemptionConfig `yaml:"preemption"`
	// Ceiling is the fraction of GPU memory that weights plus KV cache may
	// reach, in (0,1]. Default 0.75.
	Ceiling float64 `yaml:"ceiling"`
	// Reserve is activation and runtime memory kept aside per GPU. Default 1GiB.
	Reserve Size `yaml:"reserve"`
	// Pressure is the utilization of a budget above which sheddable classes
	// are refused (429 overloaded), in (0,1]. Default 0.9.
	Pressure float64 `yaml:"pressure"`
	// Queue holds the limits of every class that does not set its own
	// (admission.ClassLimits: max_requests, max_bytes, timeout).
	Queue admission.ClassLimits `yaml:"queue"`
	// Classes are priority classes, highest first (admission.ClassConfig:
	// name, its own limits, sheddable). Default: critical, standard,
	// sheddable (sheddable is shed under pressure), with the queue's limits.
	Classes []admission.ClassConfig `yaml:"classes"`
	// DefaultClass is the class of requests that name none. Default standard.
	DefaultClass string `yaml:"default_class"`
	// PriorityHeader lets a request choose a class at or below its tenant's.
	// Default X-Priority.
	PriorityHeader string `yaml:"priority_header"`
	// DefaultTenantShare caps each tenant without its own share (and
	// anonymous requests), as a fraction of a budget, in (0,1]. Default 1.
	DefaultTenantShare float64 `yaml:"default_tenant_share"`
	// DrainWindow is how far back the release rate behind Retry-After is
	// measured. Default 10s.
	DrainWindow Duration `yaml:"drain_window"`
	// MaxRetryAfter caps Retry-After. Default 60s; at most 120s, the longest
	// Retry-After the official OpenAI clients wait for (openai-python waits
	// up to 60s and backs off on its own past that).
	MaxRetryAfter Duration `yaml:"max_retry_after"`
	// Feedback shrinks a budget while its backend reports more KV in use
	// than the gateway predicted, and grows it back slowly.
	Feedback FeedbackConfig `yaml:"feedback"`
	// Reconcile compares each GPU's backends' reported KV use with what the
	// requests admitted there may hold, and takes the memory nobody
	// admitted off what the GPU admits while it lasts.
	Reconcile ReconcileConfig `yaml:"reconcile"`
}

// ReconcileConfig tunes the reconciliation of each GPU with its backends
// (admission.Reconciler).
type ReconcileConfig struct {
	// Enabled turns it on. Default true.
	Enabled *bool `yaml:"enabled"`
	// Tolerance is the fraction of the backends' pool that unaccounted
	// memory may reach without counting; one block per running request and
	// the backend's reserved block come on top. In (0, 1). Default 0.03.
	Tolerance float64 `yaml:"tolerance"`
	// Sustain is how long a figure must last to count, and a lower one to
	// replace it. Default 5s.
	Sustain Duration `yaml:"sustain"`
}

// on says whether reconciliation runs (its default resolved).
func (r ReconcileConfig) on() bool { return r.Enabled == nil || *r.Enabled }

// FeedbackConfig is the closed loop on backend-reported KV usage.
type FeedbackConfig struct {
	// Enabled turns the loop on. Default true.
	Enabled *bool `yaml:"enabled"`
	// Decrease multiplies the budget on each report over the ceiling. Default 0.9.
	Decrease float64 `yaml:"decrease"`
	// Increase adds this fraction of the budget on each report under it. Default 0.01.
	Increase float64 `yaml:"increase"`
	// MinFraction is the floor of the shrunk budget. Default 0.25.
	MinFraction float64 `yaml:"min_fraction"`
}

// on says whether the loop runs (its default resolved), as
// ReconcileConfig.on: a configuration built without Load's defaults reads
// nil as the default, never dereferences it.
func (f FeedbackConfig) on() bool { return f.Enabled == nil || *f.Enabled }

// TenantConfig is one tenant: admission's bounds on it (name, share,
// queue_share) and what the gateway adds, its keys and its class.
type TenantConfig struct {
	admission.TenantConfig `yaml:",inline"`
	// APIKeys authenticate the tenant (Authorization: Bearer KEY).
	APIKeys []string `yaml:"api_keys"`
	// Class is the tenant's priority class, the highest its requests may ask
	// for. Default: admission.default_class.
	Class string `yaml:"class"`
}

// LengthsFileConfig is admission.lengths_file.
type LengthsFileConfig struct {
	// Path is the file, relative to the config file. It is written every
	// Interval and at shutdown (a temporary file renamed over it), and read
	// once at start, before anything is admitted. Default none: off.
	Path string `yaml:"path"`
	// Interval is how often the file is written. Default 30s.
	Interval Duration `yaml:"interval"`
	// MaxAge is the oldest file that is read at start: lengths learned
	// longer ago than that are taken as no longer the traffic's, and the
	// model warms up from its own requests. Default 1h.
	MaxAge Duration `yaml:"max_age"`
}

// The admission section's defaults are configdefaults.go's. What the
// scheduler resolves itself (epsilon, warmup_samples, headroom,
// max_overcommit, cool_down, pressure, default_tenant_share, drain_window,
// max_retry_after, feedback's factors, the queue's limits, a tenant's
// shares) is left as written: its defaults are admission's, in
// admission.Config and its Default constants, which the table shows.
// maxClientRetryAfter is openai-go's cap on a Retry-After it honours.
const maxClientRetryAfter = 2 * time.Minute

// defaultClasses are the classes of a file that lists none, by name alone:
// each takes admission.queue's limits (admission.DefaultClasses, for a
// scheduler configured in code, gives critical and sheddable waits of their
// own; the file's documented default is one wait for all three).
func defaultClasses() []admission.ClassConfig {
	return []admission.ClassConfig{{Name: "critical"}, {Name: "standard"}, {Name: "sheddable"}}
}

// defaults fills the admission section from the table, then its classes.
// A class's sheddable and the default class are written in as admission
// resolves them, so that what the gateway shows is what the scheduler does.
func (a *AdmissionConfig) defaults() {
	fillDefaults("admission", a)
	if len(a.Classes) == 0 {
		a.Classes = defaultClasses()
	}
	for i := range a.Classes {
		if cl := &a.Classes[i]; cl.Sheddable == nil {
			shed := cl.IsSheddable()
			cl.Sheddable = &shed
		}
	}
	if a.DefaultClass == "" {
		a.DefaultClass = admission.DefaultClass(a.Classes)
	}
}

// validate fills and checks the admission section; it returns the names of
// its classes, which tenants refer to.
func (a *AdmissionConfig) validate(p *problems) (classes map[string]bool) {
	a.defaults()
	a.checkBudget(p)
	classes = a.checkClasses(p)
	a.checkPolicy(p)
	a.checkLoops(p)
	return classes
}

// checkBudget checks what sizes a budget, sheds from it, and what the
// queue and Retry-After take from it.
func (a *AdmissionConfig) checkBudget(p *problems) {
	if a.Ceiling < 0 || a.Ceiling > 1 {
		p.bad("admission.ceiling", "%v is not in (0, 1]", a.Ceiling)
	}
	p.size("admission.reserve", a.Reserve)
	if a.Pressure < 0 || a.Pressure > 1 {
		p.bad("admission.pressure", "%v is not in (0, 1]", a.Pressure)
	}
	if a.DefaultTenantShare < 0 || a.DefaultTenantShare > 1 {
		p.bad("admission.default_tenant_share", "%v is not in (0, 1]", a.DefaultTenantShare)
	}
	p.size("admission.queue.max_bytes", a.Queue.MaxQueuedBytes)
	p.dur("admission.queue.timeout", a.Queue.QueueTimeout)
	p.dur("admission.drain_window", a.DrainWindow)
	p.dur("admission.max_retry_after", a.MaxRetryAfter)
	if a.MaxRetryAfter.D != 0 && a.MaxRetryAfter.D < time.Second {
		p.bad("admission.max_retry_after", "must be at least 1s")
	}
	if a.MaxRetryAfter.D > maxClientRetryAfter {
		p.bad("admission.max_retry_after", "%s is above %s: the official OpenAI clients do not wait past their own cap (openai-go gives up on a longer Retry-After), so every 429 beyond it becomes a failure",
			a.MaxRetryAfter.D, maxClientRetryAfter)
	}
}

// checkClasses checks the classes and the default class; it returns the
// classes' names.
func (a *AdmissionConfig) checkClasses(p *problems) map[string]bool {
	classes := map[string]bool{}
	for i, cl := range a.Classes {
		f := fmt.Sprintf("admission.classes[%d]", i)
		p.name(classes, f+".name", "class", cl.Name)
		p.size(f+".max_bytes", cl.MaxQueuedBytes)
		p.dur(f+".timeout", cl.QueueTimeout)
	}
	if !classes[a.DefaultClass] {
		p.bad("admission.default_class", "%q is not one of admission.classes", a.DefaultClass)
	}
	return classes
}

// checkPolicy checks the mode and the reservation policy's parameters.
func (a *AdmissionConfig) checkPolicy(p *problems) {
	switch a.Mode {
	case modeKV, modeCount:
	default:
		p.bad("admission.mode", "%q is not %s or %s", a.Mode, modeKV, modeCount)
	}
	if a.MaxConcurrency < 0 {
		p.bad("admission.max_concurrency", "must be >= 1")
	}
	switch a.Reservation {
	case admission.Predicted, admission.WorstCase:
	default:
		p.bad("admission.reservation", "%q is not %s or %s", a.Reservation, admission.Predicted, admission.WorstCase)
	}
	if a.Epsilon < 0 || a.Epsilon >= 0.5 || math.IsNaN(a.Epsilon) {
		p.bad("admission.epsilon", "%v is not in (0, 0.5)", a.Epsilon)
	}
	if a.ResumableEpsilon < 0 || a.ResumableEpsilon >= 0.5 || math.IsNaN(a.ResumableEpsilon) {
		p.bad("admission.resumable_epsilon", "%v is not in (0, 0.5)", a.ResumableEpsilon)
	}
	if h := a.Headroom; h != nil && (*h < 0 || *h >= 0.5 || math.IsNaN(*h)) {
		p.bad("admission.headroom", "%v is not in [0, 0.5)", *h)
	}
	if o := a.MaxOvercommit; o != 0 && (o < 1 || math.IsNaN(o)) {
		p.bad("admission.max_overcommit", "%v must be >= 1 (a multiple of the budget)", o)
	}
	if a.AbortHold.D < 0 {
		p.bad("admission.abort_hold", "%v must be >= 0", a.AbortHold.D)
	}
	p.dur("admission.lengths_file.interval", a.LengthsFile.Interval)
	p.dur("admission.lengths_file.max_age", a.LengthsFile.MaxAge)
	if a.LengthsFile.Interval.D < 0 {
		p.bad("admission.lengths_file.interval", "%v must be > 0", a.LengthsFile.Interval.D)
	}
	if a.LengthsFile.MaxAge.D < 0 {
		p.bad("admission.lengths_file.max_age", "%v must be > 0", a.LengthsFile.MaxAge.D)
	}
}

// checkLoops checks backfill, feedback and reconciliation.
func (a *AdmissionConfig) checkLoops(p *problems) {
	p.dur("admission.backfill.max_head_age", a.Backfill.MaxHeadAge)
	p.dur("admission.preemption.after", a.Preemption.After)
	fb := a.Feedback
	if fb.Decrease < 0 || fb.Decrease >= 1 {
		p.bad("admission.feedback.decrease", "%v is not in (0, 1)", fb.Decrease)
	}
	if fb.Increase < 0 || fb.Increase > 1 {
		p.bad("admission.feedback.increase", "%v is not in (0, 1]", fb.Increase)
	}
	if fb.MinFraction < 0 || fb.MinFraction > 1 {
		p.bad("admission.feedback.min_fraction", "%v is not in (0, 1]", fb.MinFraction)
	}
	if r := a.Reconcile.Tolerance; r < 0 || r >= 1 || math.IsNaN(r) {
		p.bad("admission.reconcile.tolerance", "%v is not in (0, 1)", r)
	}
	p.dur("admission.reconcile.sustain", a.Reconcile.Sustain)
	if a.Reconcile.Sustain.D < 0 {
		p.bad("admission.reconcile.sustain", "%v must be >= 0", a.Reconcile.Sustain.D)
	}
}

// validateTenants fills and checks the tenants against the admission
// section's classes; it returns their keys, key → tenant.
func (c *Config) validateTenants(p *problems, classes map[string]bool) (keys map[string]string) {
	keys = map[string]string{}
	tenants := map[string]bool{}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		f := fmt.Sprintf("tenants[%d]", i)
		p.name(tenants, f+".name", "tenant", t.Name)
		for j, k := range t.APIKeys {
			if k == "" {
				p.bad(fmt.Sprintf("%s.api_keys[%d]", f, j), "empty key")
			} else if other, dup := keys[k]; dup {
				p.bad(fmt.Sprintf("%s.api_keys[%d]", f, j), "key already belongs to tenant %q", other)
			}
			keys[k] = t.Name
		}
		if t.Class == "" {
			t.Class = c.Admission.DefaultClass
		} else if !classes[t.Class] {
			p.bad(f+".class", "%q is not one of admission.classes", t.Class)
		}
		if t.Share < 0 || t.Share > 1 {
			p.bad(f+".share", "%v is not in (0, 1]", t.Share)
		}
		if t.QueueShare < 0 || t.QueueShare > 1 {
			p.bad(f+".queue_share", "%v is not in (0, 1]", t.QueueShare)
		}
	}
	return keys
}

// epsilon is the resolved admission.epsilon: admission's default when the
// file gives none.
func (a AdmissionConfig) epsilon() float64 { return cmp.Or(a.Epsilon, admission.DefaultEpsilon) }

// resumableEpsilon is the resolved admission.resumable_epsilon.
func (a AdmissionConfig) resumableEpsilon() float64 {
	return cmp.Or(a.ResumableEpsilon, admission.DefaultResumableEpsilon)
}

// resumes says whether streams the guard stops are resumed: under the
// predicted reservation (the only one whose guard stops anything) unless
// resume_stopped says not to.
func (a AdmissionConfig) resumes() bool {
	return a.Mode == modeKV && a.Reservation == admission.Predicted && (a.ResumeStopped == nil || *a.ResumeStopped)
}
