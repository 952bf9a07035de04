package admission

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/admission/predict"
)

// Learned lengths shared across a fleet. Each replica's scheduler learns
// from the requests it finishes; to predict from the whole fleet's traffic,
// each hands out what it learned since it last did (LengthsDelta) and adds
// in what the others handed out (MergeLengths). A queue's predictor is then
// its own samples plus everyone else's, each counted once — a replica never
// merges its own deltas, and a delta holds only samples observed here, never
// merged ones — and decayed together by the predictor's window, so that a
// replica that left fades out as new samples come in.

// LengthsDelta is what a queue learned from its own finished sequences
// since the previous call, in the layout of its predictors.
type LengthsDelta struct {
	// All counts every finished sequence, whoever the tenant.
	All predict.Snapshot `json:"all"`
	// Tenants counts those of each named tenant (at most
	// maxTenantLengths of them; the anonymous tenant is in All only).
	Tenants map[string]predict.Snapshot `json:"tenants,omitempty"`
	// Classes counts those of each class (at most maxTenantLengths).
	Classes map[string]predict.Snapshot `json:"classes,omitempty"`
}

// LengthsDelta takes what queue learned from its own finished sequences
// since the previous call; ok is false when that is nothing. A queue starts
// counting at its first call (which returns nothing): what it learned
// before, and what it merged, is never handed out. A queue whose layout
// changed (a reload changed its MaxLen, so its predictors started over)
// starts counting again.
func (s *Scheduler) LengthsDelta(queue string) (d LengthsDelta, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queueByName[queue]
	if q == nil {
		return LengthsDelta{}, false, fmt.Errorf("admission: lengths delta: unknown queue %q", queue)
	}
	if q.tally == nil || q.tally.Layout() != q.lengths.Layout() {
		q.tally, q.tallyTenants, q.tallyClasses = q.lengths.NewTally(), map[string]*predict.Tally{}, map[string]*predict.Tally{}
		return LengthsDelta{}, false, nil
	}
	if q.tally.Samples() == 0 {
		return LengthsDelta{}, false, nil
	}
	d.All = q.tally.Take()
	d.Tenants = takeTallies(q.tallyTenants)
	d.Classes = takeTallies(q.tallyClasses)
	return d, true, nil
}

// takeTallies takes each tally of m that counted something; an idle one
// goes, and comes back with its next sample.
func takeTallies(m map[string]*predict.Tally) map[string]predict.Snapshot {
	var out map[string]predict.Snapshot
	for name, t := range m {
		if t.Samples() == 0 {
			delete(m, name)
			continue
		}
		if out == nil {
			out = map[string]predict.Snapshot{}
		}
		out[name] = t.Take()
	}
	return out
}

// tallyLocked counts one finished sequence of tenant and class for
// LengthsDelta.
func (q *queue) tallyLocked(tenant, class string, n int, capped bool) {
	if q.tally == nil {
		return
	}
	q.tally.Observe(n, capped)
	if tenant != "" {
		q.tallyIn(q.tallyTenants, tenant, n, capped)
	}
	if class != "" {
		q.tallyIn(q.tallyClasses, class, n, capped)
	}
}

func (q *queue) tallyIn(m map[string]*predict.Tally, key string, n int, capped bool) {
	t := m[key]
	if t == nil && len(m) < maxTenantLengths {
		t = q.lengths.NewTally()
		m[key] = t
	}
	if t != nil {
		t.Observe(n, capped)
	}
}

// MergeLengths adds another replica's delta to queue's predictors: All to
// the queue's, each tenant's to that tenant's and each class's to that
// class's (created for it if the queue has room for another). A delta of another layout (the other replica
// configures another MaxLen for the model) is refused, changing nothing.
// Waiters are dispatched again: what the predictors now say may let them
// in.
func (s *Scheduler) MergeLengths(queue string, d LengthsDelta) error {
	s.mu.Lock()
	q := s.queueByName[queue]
	if q == nil {
		s.mu.Unlock()
		return fmt.Errorf("admission: merge lengths: unknown queue %q", queue)
	}
	if err := q.lengths.Merge(d.All); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("admission: merge lengths into queue %q: %w", queue, err)
	}
	s.fw.scratchSeq = 0 // the predictor moved: no waiter's curve computed before stands (as in observeLocked)
	errs := mergeInto(q.byTenant, d.Tenants, q.spec.maxLen, "tenant")
	errs = append(errs, mergeInto(q.byClass, d.Classes, q.spec.maxLen, "class")...)
	if s.queued > 0 {
		s.dispatchLocked()
	}
	s.unlockNotify()
	if len(errs) > 0 {
		return fmt.Errorf("admission: merge lengths into queue %q: %w", queue, errors.Join(errs...))
	}
	return nil
}

// mergeInto adds each snapshot of d to the lengths of its name in m, made
// for it if m has room.
func mergeInto(m map[string]*predict.Lengths, d map[string]predict.Snapshot, maxLen int, what string) []error {
	var errs []error
	for name, snap := range d {
		l := m[name]
		if l == nil && len(m) < maxTenantLengths && name != "" {
			l, _ = predict.NewLengths(predict.LengthsConfig{MaxLen: maxLen})
			m[name] = l
		}
		if l == nil {
			continue
		}
		if err := l.Merge(snap); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", what, name, err))
		}
	}
	return errs
}

// LengthsState is everything queue has learned, its own samples and those
// it merged, in the layout of its predictors: what a gateway that restarts
// merges back (MergeLengths) to start warm. ok is false while it has
// learned nothing.
func (s *Scheduler) LengthsState(queue string) (d LengthsDelta, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queueByName[queue]
	if q == nil {
		return LengthsDelta{}, false, fmt.Errorf("admission: lengths state: unknown queue %q", queue)
	}
	if q.lengths.Samples() == 0 {
		return LengthsDelta{}, false, nil
	}
	d.All = q.lengths.Snapshot()
	d.Tenants = snapshots(q.byTenant)
	d.Classes = snapshots(q.byClass)
	return d, true, nil
}

// snapshots copies each predictor of m that has samples.
func snapshots(m map[string]*predict.Lengths) map[string]predict.Snapshot {
	var out map[string]predict.Snapshot
	for name, l := range m {
		if l.Samples() == 0 {
			continue
		}
		if out == nil {
			out = map[string]predict.Snapshot{}
		}
		out[name] = l.Snapshot()
	}
	return out
}
