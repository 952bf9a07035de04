package gateway

import (
	"time"

	"github.com/kvgate/kvgate/admission/sharedbudget"
	"github.com/prometheus/client_golang/prometheus"
)

// Shared budget (shared_budget): this replica's leases on each GPU's
// budget and its round trips to Redis. Registered only when the gateway
// runs as a replica of a fleet (docs/METRICS.md lists them in a section of
// their own); the lessees' counters are read at scrape time, like the
// budgets (metrics_collect.go).

var (
	descLeaseHeld     = def{"kvgate_shared_budget_held_bytes", "This replica's lease on a GPU's shared budget, as Redis last answered (requests, in admission mode count).", []string{"gpu"}}.desc()
	descLeaseCapacity = def{"kvgate_shared_budget_capacity_bytes", "What this replica may commit on a GPU under the shared budget: its lease, or its static share while Redis is unreachable.", []string{"gpu"}}.desc()
	descLeaseFleet    = def{"kvgate_shared_budget_replicas_held_bytes", "All replicas' live leases on a GPU's shared budget, at this replica's last call to Redis.", []string{"gpu"}}.desc()
	descLeaseBudget   = def{"kvgate_shared_budget_bytes", "A GPU's shared budget in Redis: the smallest that a live replica announces.", []string{"gpu"}}.desc()
	descLeaseFair     = def{"kvgate_shared_budget_fair_share_bytes", "The max-min fair level of a GPU's shared budget over the live replicas' demands, which this replica admits no more than; 0 while the demands fit the budget.", []string{"gpu"}}.desc()
	descLeaseGrants   = def{"kvgate_shared_budget_grants_total", "Lease requests to Redis that granted something.", []string{"gpu"}}.desc()
	descLeaseDenials  = def{"kvgate_shared_budget_denials_total", "Lease requests to Redis that granted nothing: the budget was fully leased.", []string{"gpu"}}.desc()
	descLeaseErrors   = def{"kvgate_shared_budget_errors_total", "Calls to Redis for a GPU's lease that failed.", []string{"gpu"}}.desc()
	descLeaseLost     = def{"kvgate_shared_budget_lost_total", "Times Redis held less of this replica's lease than it counted (Redis restarted empty, or the replica stalled past its TTL).", []string{"gpu"}}.desc()
	descLeaseDrops    = def{"kvgate_shared_budget_residual_released_total", "Silent replicas' residual holds on a GPU that this replica ended because the backend's figures were covered by the live replicas' published holds (their requests were gone).", []string{"gpu"}}.desc()
	descLeaseDropped  = def{"kvgate_shared_budget_residual_released_bytes_total", "Bytes of silent replicas' residual holds that this replica ended on the backend's evidence.", []string{"gpu"}}.desc()
	descLeaseResidual = def{"kvgate_shared_budget_residual_bytes", "Silent replicas' residual holds on a GPU's shared budget (leases past their TTL that still count), at this replica's last call to Redis.", []string{"gpu"}}.desc()
	descLeaseOthers   = def{"kvgate_shared_budget_others_hold_bytes", "What the other live replicas published that their requests may hold on a GPU, at this replica's last call to Redis.", []string{"gpu"}}.desc()
	descFallback      = def{"kvgate_shared_budget_fallback", "1 while this replica cannot reach Redis and admits on its static share of a GPU's budget (budget / replicas), 0 otherwise.", []string{"gpu"}}.desc()
	defRedisRTT       = def{"kvgate_redis_round_trip_seconds", "Round trips to Redis for the shared budget, by operation (acquire, renew, release, drop, list, demand, lengths) and result (ok, error).", []string{"op", "result"}}
)

// Label values of kvgate_redis_round_trip_seconds, which exist from the start.
var (
	redisOps     = []string{"acquire", "renew", "release", "drop", "list", "demand", "lengths"}
	redisResults = []string{"ok", "error"}
)

// redisRTT is the latency histogram of the round trips to Redis, fed by
// sharedbudget.Deps.Observe: the leases, the fair-share board and the lengths sharer.
type redisRTT struct{ h *prometheus.HistogramVec }

func newRedisRTT() *redisRTT {
	r := &redisRTT{h: defRedisRTT.histogramVec(prometheus.ExponentialBucketsRange(0.00005, 2, 16))}
	for _, op := range redisOps {
		for _, res := range redisResults {
			r.h.WithLabelValues(op, res)
		}
	}
	return r
}

func (r *redisRTT) observe(op string, took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	r.h.WithLabelValues(op, result).Observe(took.Seconds())
}

// sharedBudgetCollector reads the lessees at scrape time.
type sharedBudgetCollector struct{ f *sharedbudget.Replica }

func (c sharedBudgetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLeaseHeld, descLeaseCapacity, descLeaseFleet, descLeaseBudget, descLeaseFair,
		descLeaseGrants, descLeaseDenials, descLeaseErrors, descLeaseLost, descLeaseDrops, descLeaseDropped, descLeaseResidual, descLeaseOthers, descFallback} {
		ch <- d
	}
}

func (c sharedBudgetCollector) Collect(ch chan<- prometheus.Metric) {
	for _, ls := range c.f.Leases() {
		s := ls.Stats
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, ls.GPU)
		}
		counter := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), ls.GPU)
		}
		gauge(descLeaseHeld, float64(s.Leased))
		gauge(descLeaseCapacity, float64(s.Capacity))
		gauge(descLeaseFleet, float64(s.FleetLeased))
		gauge(descLeaseBudget, float64(s.Budget))
		gauge(descLeaseFair, float64(max(ls.Level, 0)))
		gauge(descFallback, boolFloat(s.Fallback))
		counter(descLeaseGrants, s.Grants)
		counter(descLeaseDenials, s.Denials)
		counter(descLeaseErrors, s.Failures)
		counter(descLeaseLost, s.LostLeases)
		counter(descLeaseDrops, s.ResidualDrops)
		counter(descLeaseDropped, uint64(s.ResidualDropped))
		gauge(descLeaseResidual, float64(s.Residual))
		gauge(descLeaseOthers, float64(s.OthersHold))
	}
}
