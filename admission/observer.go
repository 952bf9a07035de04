package admission

import (
	"maps"
	"sort"
	"sync/atomic"
	"time"
)

// Event is a request leaving Acquire (or Move), as the Observer sees it.
type Event struct {
	Queue, Class, Tenant string
	// GPU is where an admitted request was bound ("" for a refusal).
	GPU    string
	Weight int64         // its worst case
	Waited time.Duration // time queued (0 if admitted or refused at once)
	// Backfilled says it was admitted past an earlier waiter that did not
	// fit (see doc.go, "Order").
	Backfilled bool
	// Preemptive says it was admitted on room that resumable streams of
	// lower classes hold (see preemption.go).
	Preemptive bool
}

// Observer is told about every request that leaves Acquire: admitted (at
// once, with Waited 0, or after queueing) or refused with a reason label
// (see ReasonOf; "canceled" included). It is how the gateway builds its
// counters and wait histograms. The scheduler calls it outside its lock,
// from the goroutine that called Acquire, so an implementation may be
// slow-ish but must be safe for concurrent use.
type Observer interface {
	Admitted(e Event)
	Rejected(e Event, reason string)
}

// Stats is a snapshot of a scheduler, as plain values.
type Stats struct {
	Queued int // waiting requests, all queues

	Admitted          int64            // every admission, at once or after waiting
	AdmittedAfterWait int64            // those that queued first
	Backfilled        int64            // admitted past an earlier waiter that did not fit
	Preemptive        int64            // admitted on room that resumable streams of lower classes hold
	Rejected          map[string]int64 // by reason label (all of Reasons(), zeros included)
	Canceled          int64            // contexts done before admission
	// GuardStops counts running requests the guard stopped to keep a GPU
	// within its capacity; Trips the times a forecast was distrusted, by
	// reason (TripDrift, TripGuard, TripOverflow): a queue's, or for drift
	// a tenant's or class's of a queue. DriftTrips splits the drift trips
	// by what was distrusted (DriftQueue, DriftTenant, DriftClass, zeros
	// included).
	GuardStops int64
	Trips      map[string]int64
	DriftTrips map[string]int64

	GPUs    []GPUStats    // in configuration order
	Queues  []QueueStats  // in configuration order
	Tenants []TenantStats // sorted by name; listed tenants always, others while active
}

// GPUStats is one GPU in Stats.
type GPUStats struct {
	Name      string
	Capacity  int64 // nominal
	Effective int64 // after the AIMD loop; <= Capacity
	// Limit is the external cap SetLimit put on what it may commit (-1:
	// none); admissions are measured against min(Effective, Limit).
	Limit int64
	// Margin is the scale of its forecast's safety margin (SetMargin; 1 by
	// default).
	Margin float64
	// Held is the worst case of what is bound to it; it may exceed Effective
	// under Predicted, and after a shrink, never through an admission under
	// WorstCase.
	Held int64
	// Committed is what admissions are measured against: Held under
	// WorstCase, the peak of the forecast under Predicted.
	Committed int64
	// Charge is Σ of its tickets' charges (see doc.go).
	Charge  int64
	Tickets int
	// Shared is the bytes of prompt blocks it counts once for the tickets
	// that share them (part of Held and Charge); SharedSaved what counting
	// them once per ticket would have added (SetSharing).
	Shared, SharedSaved int64
	// PromptBlocks and SharedBlocks count, over every admission to it
	// while it shared, the prompt blocks that could be shared and those
	// found held already.
	PromptBlocks, SharedBlocks int64
	// Used is what its backends last reported in use; UsedKnown false until
	// they do. Gated says that report keeps it closed to new admissions.
	Used      int64
	UsedKnown bool
	Gated     bool
	// Unaccounted is what SetUnaccounted takes off its effective capacity:
	// memory its backends hold that no admitted request accounts for.
	Unaccounted int64
	// Now is what its tickets may hold on the backend at this moment (the
	// guard's account: progress plus lead, or the worst case of those that
	// do not report it); Stopping the part of it the guard stopped and that
	// is not released yet.
	Now, Stopping int64
	// DrainRate is the measured release rate in charge per busy second over
	// the drain window, resting on Releases releases (0: no measurement).
	DrainRate float64
	Releases  int
	// Reserved names the queue whose first waiter holds a reservation on it
	// ("" if none), Blocking says it lets nobody pass.
	Reserved string
	Blocking bool
}

// QueueStats is one queue in Stats.
type QueueStats struct {
	Name        string
	Queued      int
	QueuedBytes int64
	Classes     []ClassStats // in priority order
	GPUs        []RouteStats
	// Samples is how many finished sequences its predictor has (decayed);
	// Predicting says new requests are forecast from them (Predicted, past
	// the warm-up); MedianLength and P90Length describe them (0 if unknown).
	Samples    float64
	Predicting bool
	// Distrusted says its forecast was found wrong and is in its
	// cool-down: its requests are held at their worst case.
	Distrusted   bool
	MedianLength int
	P90Length    int
}

// ClassStats is one class of a queue. Held is the worst case of the tickets
// admitted through it.
type ClassStats struct {
	Name        string
	Queued      int
	QueuedBytes int64
	Held        int64
}

// RouteStats is one GPU of a queue and whether it is available to it.
type RouteStats struct {
	GPU string
	Up  bool
}

// TenantStats is one tenant in Stats: the charge it holds, all GPUs
// together, and what it has queued.
type TenantStats struct {
	Name        string
	Held        int64
	Queued      int
	QueuedBytes int64
}

// counters are the exit-path counts of the slow paths. They are atomics
// rather than fields under Scheduler.mu because the waiter goroutines count
// their own outcome after the lock is gone. (Immediate admissions are
// counted in Scheduler.atOnce, under the lock the fast path holds.)
type counters struct {
	admittedAfterWait, canceled atomic.Int64
	rejected                    [6]atomic.Int64 // indexed by reasonIndex
}

// Stats returns a snapshot. It takes the scheduler's lock once.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	now := s.clock.Now()
	st := Stats{Queued: s.queued, Admitted: s.atOnce, Backfilled: s.backfilled, Preemptive: s.preempt.admitted, GuardStops: s.stops.guardStops,
		Trips: map[string]int64{TripDrift: 0, TripGuard: 0, TripOverflow: 0}}
	maps.Copy(st.Trips, s.stops.trips)
	st.DriftTrips = s.driftTripsLocked()
	for _, p := range s.gpus {
		ps := GPUStats{Name: p.name, Capacity: p.nominal, Effective: p.effective, Limit: p.limitOrNone(), Margin: p.marginOrOne(), Held: p.held,
			Committed: s.committedLocked(p), Charge: p.charge, Tickets: p.tickets,
			Used: p.report.used, UsedKnown: p.report.known, Unaccounted: p.report.unaccounted, Gated: s.gatedLocked(p), Now: p.now, Stopping: p.stopping,
			Shared: p.tableBytes, SharedSaved: p.sharedRefs - p.tableBytes, PromptBlocks: p.hits.prompt, SharedBlocks: p.hits.held}
		ps.DrainRate, ps.Releases = p.drain.rate(now)
		if p.res.kind != resNone && p.res.head.state == waiting {
			ps.Reserved, ps.Blocking = p.res.head.line.q.name, p.res.kind == resBlock
		}
		st.GPUs = append(st.GPUs, ps)
	}
	for _, q := range s.queues {
		trusted := s.trustedLocked(q)
		qs := QueueStats{Name: q.name, Samples: q.lengths.Samples(), Distrusted: !trusted,
			Predicting: s.set.policy.predicted && trusted && q.lengths.Samples() >= s.set.policy.warmup}
		if n, ok := q.lengths.Quantile(0.5); ok && qs.Samples > 0 {
			qs.MedianLength = n
		}
		if n, ok := q.lengths.Quantile(0.9); ok && qs.Samples > 0 {
			qs.P90Length = n
		}
		for _, l := range q.lines {
			qs.Classes = append(qs.Classes, ClassStats{Name: l.name, Queued: l.queued, QueuedBytes: l.queuedBytes, Held: l.held})
			qs.Queued += l.queued
			qs.QueuedBytes += l.queuedBytes
		}
		for _, r := range q.routes {
			qs.GPUs = append(qs.GPUs, RouteStats{GPU: r.p.name, Up: r.up})
		}
		st.Queues = append(st.Queues, qs)
	}
	for _, t := range s.tenants {
		if t.idle() {
			continue
		}
		st.Tenants = append(st.Tenants, TenantStats{Name: t.name, Held: t.held(), Queued: t.queued, QueuedBytes: t.queuedBytes})
	}
	s.mu.Unlock()
	sort.Slice(st.Tenants, func(i, j int) bool { return st.Tenants[i].Name < st.Tenants[j].Name })
	st.AdmittedAfterWait = s.count.admittedAfterWait.Load()
	st.Admitted += st.AdmittedAfterWait
	st.Canceled = s.count.canceled.Load()
	st.Rejected = make(map[string]int64, len(reasons))
	for i, r := range reasons {
		st.Rejected[reasonLabel(r)] = s.count.rejected[i].Load()
	}
	return st
}

// GPU returns one GPU's stats, and false if there is no such GPU.
func (s *Scheduler) GPU(name string) (GPUStats, bool) {
	for _, p := range s.Stats().GPUs {
		if p.Name == name {
			return p, true
		}
	}
	return GPUStats{}, false
}
