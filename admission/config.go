package admission

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Defaults that zero values in Config stand for.
const (
	DefaultMaxQueued          = 1024
	DefaultQueuedBytesFactor  = 4 // MaxQueuedBytes 0 = this many times the nominal capacity
	DefaultQueueTimeout       = 30 * time.Second
	DefaultPressureThreshold  = 0.9
	DefaultDrainWindow        = 10 * time.Second
	DefaultMaxRetryAfter      = 60 * time.Second
	MinRetryAfter             = time.Second // Retry-After is whole seconds on the wire
	DefaultAIMDDecrease       = 0.9
	DefaultAIMDIncrease       = 0.01
	DefaultAIMDMinFraction    = 0.25
	defaultClassPreferredName = "standard"
)

// ClassConfig is one priority class. Classes are listed highest priority
// first.
type ClassConfig struct {
	Name string // unique, non-empty
	// MaxQueued bounds how many requests of this class may wait at once.
	// 0 = DefaultMaxQueued (1024); negative = never queue: a request that does
	// not fit at once is refused with ErrQueueFull.
	MaxQueued int
	// MaxQueuedBytes bounds the summed weight of the waiting requests of this
	// class. 0 = DefaultQueuedBytesFactor (4) × the nominal capacity, following
	// Resize; negative = no bound in bytes (MaxQueued still applies).
	MaxQueuedBytes int64
	// QueueTimeout is the longest a request of this class waits in the queue.
	// 0 = DefaultQueueTimeout (30s); negative = no class limit (only the
	// request's own Deadline and its context end the wait).
	QueueTimeout time.Duration
	// Sheddable requests are refused with ErrOverloaded while utilization
	// (held / effective capacity) is above Config.PressureThreshold.
	Sheddable bool
}

// TenantConfig bounds one tenant.
type TenantConfig struct {
	Name string // unique, non-empty ("" is the anonymous tenant, see DefaultTenantShare)
	// Share is the largest fraction of the nominal capacity the tenant may
	// hold at once, in (0,1]. 0 = Config.DefaultTenantShare.
	Share float64
	// QueueShare is the largest fraction of each class's queue (both count
	// and bytes, rounded up) the tenant may occupy, in (0,1]. 0 = Share.
	QueueShare float64
}

// AIMDConfig shapes the closed loop driven by Budget.Feedback. The effective
// capacity starts at the nominal one.
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

// Config is a budget's configuration. The zero value of every field but
// Capacity is usable.
type Config struct {
	Capacity int64 // nominal capacity in weight units (bytes of KV cache); > 0
	// Classes, highest priority first. Empty = DefaultClasses().
	Classes []ClassConfig
	// DefaultClass is the class of a Request with Class "". "" = "standard"
	// if there is such a class, else Classes[len(Classes)/2] (the middle one).
	DefaultClass string
	Tenants      []TenantConfig
	// DefaultTenantShare is the share of every tenant not listed in Tenants,
	// each on its own, including the anonymous tenant "", in (0,1].
	// 0 = 1.0 (no cap beyond the capacity itself).
	DefaultTenantShare float64
	// PressureThreshold is the utilization (held / effective capacity) above
	// which Sheddable classes are refused, in (0,1]. 0 = 0.9.
	PressureThreshold float64
	// DrainWindow is how far back the release rate is measured. 0 = 10s.
	DrainWindow time.Duration
	// MaxRetryAfter caps RejectError.RetryAfter (which is never below
	// MinRetryAfter, 1s, when retrying can help). 0 = 60s; must be >= 1s.
	MaxRetryAfter time.Duration
	AIMD          AIMDConfig
	// Clock is the source of time. nil = SystemClock(). Fixed at New:
	// Reconfigure ignores it.
	Clock Clock
	// Observer receives every admission and refusal. nil = none. Fixed at
	// New: Reconfigure ignores it.
	Observer Observer
}

// DefaultClasses are critical, standard and sheddable, in that order.
func DefaultClasses() []ClassConfig {
	return []ClassConfig{
		{Name: "critical", MaxQueued: DefaultMaxQueued, QueueTimeout: 60 * time.Second},
		{Name: "standard", MaxQueued: DefaultMaxQueued, QueueTimeout: DefaultQueueTimeout},
		{Name: "sheddable", MaxQueued: DefaultMaxQueued, QueueTimeout: 10 * time.Second, Sheddable: true},
	}
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

// settings is a validated Config with every default filled in.
type settings struct {
	capacity      int64
	classes       []classSpec
	defaultClass  int
	tenants       map[string]tenantSpec
	defaultShare  float64
	pressure      float64
	drainWindow   time.Duration
	maxRetryAfter time.Duration
	aimd          aimdSpec
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

// resolve validates cfg and fills its defaults. Every problem is reported,
// each prefixed by the field's name.
func resolve(cfg Config) (settings, error) {
	var errs []error
	bad := func(err error) { errs = append(errs, err) }
	s := settings{capacity: cfg.Capacity, tenants: make(map[string]tenantSpec, len(cfg.Tenants))}
	if cfg.Capacity <= 0 {
		bad(fmt.Errorf("capacity: %d must be > 0", cfg.Capacity))
	}

	classes := cfg.Classes
	if len(classes) == 0 {
		classes = DefaultClasses()
	}
	seen := make(map[string]int, len(classes))
	for i, c := range classes {
		if c.Name == "" {
			bad(fmt.Errorf("classes[%d].name: must not be empty", i))
		} else if j, dup := seen[c.Name]; dup {
			bad(fmt.Errorf("classes[%d].name: %q already names classes[%d]", i, c.Name, j))
		}
		seen[c.Name] = i
		cs := classSpec{name: c.Name, maxQueued: c.MaxQueued, maxQueuedBytes: c.MaxQueuedBytes,
			timeout: c.QueueTimeout, sheddable: c.Sheddable}
		if cs.maxQueued == 0 {
			cs.maxQueued = DefaultMaxQueued
		}
		if cs.timeout == 0 {
			cs.timeout = DefaultQueueTimeout
		}
		s.classes = append(s.classes, cs)
	}
	switch i, ok := seen[cfg.DefaultClass]; {
	case cfg.DefaultClass != "" && !ok:
		bad(fmt.Errorf("default_class: %q is not one of the classes", cfg.DefaultClass))
	case cfg.DefaultClass != "":
		s.defaultClass = i
	default:
		if i, ok := seen[defaultClassPreferredName]; ok {
			s.defaultClass = i
		} else {
			s.defaultClass = len(classes) / 2
		}
	}

	var err error
	if s.defaultShare, err = fraction("default_tenant_share", cfg.DefaultTenantShare, 1, false); err != nil {
		bad(err)
	}
	for i, t := range cfg.Tenants {
		field := fmt.Sprintf("tenants[%d]", i)
		if t.Name == "" {
			bad(fmt.Errorf("%s.name: must not be empty (the anonymous tenant takes default_tenant_share)", field))
		} else if _, dup := s.tenants[t.Name]; dup {
			bad(fmt.Errorf("%s.name: tenant %q is listed twice", field, t.Name))
		}
		share, err := fraction(field+".share", t.Share, s.defaultShare, false)
		if err != nil {
			bad(err)
		}
		qs, err := fraction(field+".queue_share", t.QueueShare, share, false)
		if err != nil {
			bad(err)
		}
		s.tenants[t.Name] = tenantSpec{share: share, queueShare: qs}
	}

	if s.pressure, err = fraction("pressure_threshold", cfg.PressureThreshold, DefaultPressureThreshold, false); err != nil {
		bad(err)
	}
	switch s.drainWindow = cfg.DrainWindow; {
	case s.drainWindow == 0:
		s.drainWindow = DefaultDrainWindow
	case s.drainWindow < drainBuckets*time.Millisecond:
		bad(fmt.Errorf("drain_window: %v must be >= %v (0 = default %v)", cfg.DrainWindow, drainBuckets*time.Millisecond, DefaultDrainWindow))
	}
	switch s.maxRetryAfter = cfg.MaxRetryAfter; {
	case s.maxRetryAfter == 0:
		s.maxRetryAfter = DefaultMaxRetryAfter
	case s.maxRetryAfter < MinRetryAfter:
		bad(fmt.Errorf("max_retry_after: %v must be >= %v (0 = default %v)", cfg.MaxRetryAfter, MinRetryAfter, DefaultMaxRetryAfter))
	}
	if s.aimd.decrease, err = fraction("aimd.decrease", cfg.AIMD.Decrease, DefaultAIMDDecrease, true); err != nil {
		bad(err)
	}
	if s.aimd.increase, err = fraction("aimd.increase", cfg.AIMD.Increase, DefaultAIMDIncrease, false); err != nil {
		bad(err)
	}
	if s.aimd.minFraction, err = fraction("aimd.min_fraction", cfg.AIMD.MinFraction, DefaultAIMDMinFraction, false); err != nil {
		bad(err)
	}
	if len(errs) > 0 {
		return settings{}, fmt.Errorf("admission: invalid config: %w", errors.Join(errs...))
	}
	return s, nil
}
