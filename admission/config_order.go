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
	switch maxHeadAge = b.MaxHeadAge.D; {
	case maxHeadAge == 0:
		maxHeadAge = DefaultMaxHeadAge
	case maxHeadAge < 0:
		maxHeadAge = 0
	}
	return b.IsEnabled(), maxHeadAge
}
