package admission

import (
	"time"

	"github.com/kvgate/kvgate/internal/confval"
)

// How waiters are ordered beyond class and arrival: backfilling past a
// head that does not fit (dispatch.go) and preemption of lower classes
// (preemption.go).

// BackfillConfig shapes how waiters may pass a head that does not fit. The
// yaml tags are the keys of the gateway's admission.backfill.
type BackfillConfig struct {
	// Enabled lets waiters that fit start past a head that does not, while
	// that does not delay the head. nil = true. Off, every line is strictly
	// first come, first served: a waiter that fits nowhere holds back
	// everyone behind it in its queue and every GPU it could use.
	Enabled *bool `yaml:"enabled"`
	// MaxHeadAge is how long the first blocked waiter may be passed; older,
	// it holds back everyone as if backfilling were off. 0 =
	// DefaultMaxHeadAge (10s); negative = no limit.
	MaxHeadAge confval.Duration `yaml:"max_head_age"`
}

// IsEnabled is the resolved Enabled.
func (b BackfillConfig) IsEnabled() bool { return b.Enabled == nil || *b.Enabled }

// resolveBackfill resolves whether waiters may pass a blocked head, and
// for how long (0: no limit).
func resolveBackfill(b BackfillConfig) (on bool, maxHeadAge time.Duration) {
	return b.IsEnabled(), confval.Or(b.MaxHeadAge.D, DefaultMaxHeadAge)
}

// PreemptionConfig shapes when a waiter of a higher class may start on
// room of lower classes (preemption.go). The yaml tags are the keys of the
// gateway's admission.preemption.
type PreemptionConfig struct {
	// Enabled lets a waiter of a higher class that fits nowhere on the
	// forecast start on room that resumable streams of lower classes hold,
	// which the guard stops if it is needed (Predicted only). nil = true.
	Enabled *bool `yaml:"enabled"`
	// After is how long such a waiter first waits for room to free on its
	// own: most waits in a busy pool end within a release or two, and each
	// preemptive start can cost a lower class's stream a stop and a
	// recompute. 0 = DefaultPreemptAfter (200ms); negative = at once.
	After confval.Duration `yaml:"after"`
}

// IsEnabled is the resolved Enabled.
func (p PreemptionConfig) IsEnabled() bool { return p.Enabled == nil || *p.Enabled }

// resolvePreemption resolves whether waiters may start preemptively, and
// after how long a wait (0: at once).
func resolvePreemption(p PreemptionConfig) (on bool, after time.Duration) {
	return p.IsEnabled(), confval.Or(p.After.D, DefaultPreemptAfter)
}
