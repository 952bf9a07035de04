package admission

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The reasons for refusing a request. Every refusal is a *RejectError whose
// Reason is exactly one of these, so errors.Is matches exactly one of them.
var (
	// ErrTooLarge: the weight exceeds the nominal capacity of every GPU of
	// the queue; it could never be admitted, so RetryAfter is 0.
	ErrTooLarge = errors.New("request larger than the whole budget")
	// ErrTenantQuota: the request exceeds what its tenant may hold at once on
	// any GPU of the queue (its share of the capacity); retrying never
	// helps, RetryAfter is 0.
	ErrTenantQuota = errors.New("request larger than the tenant's quota")
	// ErrQueueFull: the class's line, or the tenant's share of it, is full
	// (in count or bytes), the class never queues, or the class was removed
	// by Reconfigure while the request waited.
	ErrQueueFull = errors.New("admission queue full")
	// ErrQueueTimeout: the deadline passed while queued, or the expected wait
	// (from the measured drain rate) exceeds the time left before it.
	ErrQueueTimeout = errors.New("admission queue timeout")
	// ErrOverloaded: a sheddable class was refused because every GPU that
	// could serve it is above the pressure threshold.
	ErrOverloaded = errors.New("overloaded: sheddable request refused")
	// ErrNoRoute: no GPU of the queue is available (SetAvailable), or the
	// queue was removed by Reconfigure. Waiters are refused with it the
	// moment the last GPU goes, not at their deadline.
	ErrNoRoute = errors.New("no GPU available")
)

// RejectError is a refusal. It carries what the gateway needs to answer:
// the reason, when to retry, and the sizes involved.
type RejectError struct {
	Reason error // one of the sentinels above
	// RetryAfter is when a retry is expected to succeed, from the drain-rate
	// estimate (see doc.go); 0 when retrying cannot help.
	RetryAfter time.Duration
	Weight     int64 // the request's worst-case weight
	// Capacity is the limit the request was measured against: the largest
	// nominal capacity for ErrTooLarge, the tenant's largest cap for
	// ErrTenantQuota, the queue's effective capacity otherwise (0 for
	// ErrNoRoute).
	Capacity int64
	Waited   time.Duration // time spent queued before the refusal (0 if refused at once)
	Queue    string
	Class    string
	Tenant   string
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("admission: %v: queue %q, class %q, tenant %q, weight %d, capacity %d, waited %v, retry after %v",
		e.Reason, e.Queue, e.Class, e.Tenant, e.Weight, e.Capacity, e.Waited, e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrQueueFull) and friends work.
func (e *RejectError) Unwrap() error { return e.Reason }

// Reason labels, as ReasonOf returns them and Observer.Rejected receives them.
const (
	ReasonTooLarge     = "too_large"
	ReasonQueueFull    = "queue_full"
	ReasonQueueTimeout = "queue_timeout"
	ReasonOverloaded   = "overloaded"
	ReasonTenantQuota  = "tenant_quota"
	ReasonNoRoute      = "no_route"
	ReasonCanceled     = "canceled"
)

var reasons = []error{ErrTooLarge, ErrQueueFull, ErrQueueTimeout, ErrOverloaded, ErrTenantQuota, ErrNoRoute}

// Reasons lists the refusal labels (without "canceled"), for exporters that
// want every series to exist from the start.
func Reasons() []string {
	out := make([]string, len(reasons))
	for i, r := range reasons {
		out[i] = reasonLabel(r)
	}
	return out
}

func reasonLabel(reason error) string {
	switch reason {
	case ErrTooLarge:
		return ReasonTooLarge
	case ErrQueueFull:
		return ReasonQueueFull
	case ErrQueueTimeout:
		return ReasonQueueTimeout
	case ErrOverloaded:
		return ReasonOverloaded
	case ErrTenantQuota:
		return ReasonTenantQuota
	case ErrNoRoute:
		return ReasonNoRoute
	}
	return ""
}

func reasonIndex(reason error) int {
	for i, r := range reasons {
		if r == reason {
			return i
		}
	}
	return 0
}

// ReasonOf is the metric label for an error returned by Acquire or Move:
// one of the Reason constants, "canceled" for a context cancellation or
// deadline, and "" otherwise (an invalid request, or nil).
func ReasonOf(err error) string {
	var re *RejectError
	if errors.As(err, &re) {
		return reasonLabel(re.Reason)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ReasonCanceled
	}
	return ""
}
