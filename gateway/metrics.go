package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
)

// metrics are the gateway's Prometheus series, on a registry of its own.
// Budgets and backends are read at scrape time from the current runtime, so
// a reload needs no re-registration.
type metrics struct {
	reg *prometheus.Registry

	requests        *prometheus.CounterVec
	admissions      *prometheus.CounterVec
	queueWait       *prometheus.HistogramVec
	tokensPredicted *prometheus.CounterVec
	tokensActual    *prometheus.CounterVec
	promptRatio     *prometheus.HistogramVec
	ttft            *prometheus.HistogramVec
	duration        *prometheus.HistogramVec
	upstreamErrors  *prometheus.CounterVec
	reloads         *prometheus.CounterVec
	inflight        prometheus.Gauge
	backfilled      *prometheus.CounterVec
	outPredicted    *prometheus.CounterVec
	outGenerated    *prometheus.CounterVec
}

// Request outcomes: every request leaves through exactly one.
const (
	outcomeOK       = "ok"       // answered by a backend with 2xx
	outcomeShed     = "shed"     // 429 from admission (reason: queue_full, queue_timeout, overloaded, tenant_quota)
	outcomeRejected = "rejected" // 4xx decided by the gateway (reason says which)
	outcomeFailed   = "failed"   // 5xx: no backend, upstream error or timeout, or a backend's own error status
	outcomeCanceled = "canceled" // the client went away
)

func newMetrics(current func() *runtime) *metrics {
	reg := prometheus.NewRegistry()
	latency := prometheus.ExponentialBucketsRange(0.005, 300, 20)
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_requests_total", Help: "Requests by model, outcome (ok, shed, rejected, failed, canceled) and reason.",
		}, []string{"model", "outcome", "reason"}),
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_admissions_total", Help: "Requests admitted to a GPU's KV budget, by whether they queued first.",
		}, []string{"gpu", "class", "queued"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_queue_wait_seconds", Help: "Time requests spent in their model's admission queue, admitted or not.",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 120, 18),
		}, []string{"model", "class", "result"}),
		backfilled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_admission_backfilled_total", Help: "Requests admitted past an earlier request that did not fit, without delaying its expected start (EASY backfilling).",
		}, []string{"model", "gpu"}),
		outPredicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_output_tokens_predicted_total", Help: "Output tokens predicted at admission for requests that finished: the learned median length, capped by max_tokens (max_tokens itself while the model warms up or under worst_case).",
		}, []string{"model"}),
		outGenerated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_output_tokens_generated_total", Help: "Output tokens the same requests really generated.",
		}, []string{"model"}),
		tokensPredicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_tokens_predicted_total", Help: "Tokens the gateway reserved KV for: prompt (predicted) and output (max_tokens), of answered requests.",
		}, []string{"model", "kind"}),
		tokensActual: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_tokens_actual_total", Help: "Tokens backends reported in usage for the same requests.",
		}, []string{"model", "kind"}),
		promptRatio: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_prompt_tokens_actual_over_predicted", Help: "Actual / predicted prompt tokens per request: above 1 the prediction was low.",
			Buckets: []float64{0.5, 0.7, 0.8, 0.9, 0.95, 1, 1.02, 1.05, 1.1, 1.2, 1.5, 2},
		}, []string{"model", "tokenizer"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_time_to_first_token_seconds", Help: "Arrival to the first streamed event relayed to the client, queueing included.",
			Buckets: latency,
		}, []string{"model"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_request_duration_seconds", Help: "Arrival to last byte, by outcome.",
			Buckets: latency,
		}, []string{"model", "outcome"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_upstream_errors_total", Help: "Failures talking to backends: transport, timeout, status (5xx answers).",
		}, []string{"backend", "kind"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_config_reloads_total", Help: "Configuration reloads by result.",
		}, []string{"result"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_requests_in_flight", Help: "Requests between arrival and last byte.",
		}),
	}
	reg.MustRegister(m.requests, m.admissions, m.queueWait, m.tokensPredicted, m.tokensActual, m.promptRatio,
		m.ttft, m.duration, m.upstreamErrors, m.reloads, m.inflight, m.backfilled, m.outPredicted, m.outGenerated,
		&stateCollector{current: current},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observer feeds the scheduler's admissions into the metrics.
type observer struct{ m *metrics }

func (o observer) Admitted(e admission.Event) {
	queued := "false"
	if e.Waited > 0 {
		queued = "true"
		o.m.queueWait.WithLabelValues(e.Queue, e.Class, "admitted").Observe(e.Waited.Seconds())
	}
	o.m.admissions.WithLabelValues(e.Pool, e.Class, queued).Inc()
	if e.Backfilled {
		o.m.backfilled.WithLabelValues(e.Queue, e.Pool).Inc()
	}
}

func (o observer) Rejected(e admission.Event, reason string) {
	if e.Waited > 0 {
		o.m.queueWait.WithLabelValues(e.Queue, e.Class, reason).Observe(e.Waited.Seconds())
	}
}

var (
	descCapacity   = prometheus.NewDesc("kvgate_kv_capacity_bytes", "KV budget of a GPU: memory × ceiling − weights − reserve, clamped to the backend's reported pool (requests, in admission mode count).", []string{"gpu"}, nil)
	descEffective  = prometheus.NewDesc("kvgate_kv_effective_capacity_bytes", "KV budget after the feedback loop.", []string{"gpu"}, nil)
	descHeld       = prometheus.NewDesc("kvgate_kv_held_bytes", "Worst case of the requests bound to a GPU (prompt + max_tokens, minus finished sequences).", []string{"gpu"}, nil)
	descCommitted  = prometheus.NewDesc("kvgate_kv_committed_bytes", "What admissions to a GPU are measured against: the held worst case, or under the predicted policy the forecast peak of its batch's memory.", []string{"gpu"}, nil)
	descUsed       = prometheus.NewDesc("kvgate_kv_used_bytes", "KV bytes a GPU's backends report in use (vllm:kv_cache_usage_perc × their pool).", []string{"gpu"}, nil)
	descBound      = prometheus.NewDesc("kvgate_kv_bound_requests", "Requests bound to a GPU (admitted, not yet released).", []string{"gpu"}, nil)
	descGated      = prometheus.NewDesc("kvgate_kv_headroom_gate", "1 while a GPU's backends report more than (1 − headroom) × its budget in use, so nothing new is admitted to it.", []string{"gpu"}, nil)
	descQueued     = prometheus.NewDesc("kvgate_kv_queued_bytes", "Worst-case KV bytes of the requests waiting for a model.", []string{"model"}, nil)
	descDrain      = prometheus.NewDesc("kvgate_kv_drain_rate_bytes_per_second", "Measured release rate per busy second behind Retry-After.", []string{"gpu"}, nil)
	descDepth      = prometheus.NewDesc("kvgate_queue_depth", "Requests waiting for admission, per model and class.", []string{"model", "class"}, nil)
	descPredicting = prometheus.NewDesc("kvgate_admission_predicting", "1 when a model's requests are admitted by their predicted growth (past the warm-up), 0 while held at their worst case.", []string{"model"}, nil)
	descSamples    = prometheus.NewDesc("kvgate_admission_length_samples", "Finished sequences a model's output-length predictor rests on (decayed).", []string{"model"}, nil)
	descEpsilon    = prometheus.NewDesc("kvgate_admission_epsilon", "The bound on the probability that a GPU's real KV use passes its budget, per admission, under the predicted policy (0 under worst_case and count).", nil, nil)
	descUp         = prometheus.NewDesc("kvgate_backend_up", "1 if requests are routed to the backend (circuit closed or half-open).", []string{"backend", "state"}, nil)
	descUsage      = prometheus.NewDesc("kvgate_backend_kv_usage_ratio", "KV cache usage the backend reports (vllm:kv_cache_usage_perc).", []string{"backend"}, nil)
	descRunning    = prometheus.NewDesc("kvgate_backend_requests_running", "Requests the backend reports running.", []string{"backend"}, nil)
	descWaiting    = prometheus.NewDesc("kvgate_backend_requests_waiting", "Requests the backend reports waiting.", []string{"backend"}, nil)
	descPreempt    = prometheus.NewDesc("kvgate_backend_preemptions", "Preemptions the backend reports (its counter).", []string{"backend"}, nil)
)

// stateCollector reads budgets and backends at scrape time.
type stateCollector struct{ current func() *runtime }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCapacity, descEffective, descHeld, descCommitted, descUsed, descBound, descGated,
		descQueued, descDrain, descDepth, descPredicting, descSamples, descEpsilon, descUp, descUsage, descRunning, descWaiting, descPreempt} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	rt := c.current()
	if rt == nil || rt.sched == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	st := rt.sched.Stats()
	gpuOf := map[string]string{} // pool → GPU name (they differ after a rename)
	for name, g := range rt.groups {
		gpuOf[g.pool] = name
	}
	for _, p := range st.Pools {
		gpu := gpuOf[p.Name]
		gauge(descCapacity, float64(p.Capacity), gpu)
		gauge(descEffective, float64(p.Effective), gpu)
		gauge(descHeld, float64(p.Held), gpu)
		gauge(descCommitted, float64(p.Committed), gpu)
		if p.UsedKnown {
			gauge(descUsed, float64(p.Used), gpu)
		}
		gauge(descBound, float64(p.Tickets), gpu)
		gauge(descGated, b2f(p.Gated), gpu)
		gauge(descDrain, p.DrainRate, gpu)
	}
	for _, q := range st.Queues {
		gauge(descQueued, float64(q.QueuedBytes), q.Name)
		for _, cl := range q.Classes {
			gauge(descDepth, float64(cl.Queued), q.Name, cl.Name)
		}
		gauge(descPredicting, b2f(q.Predicting), q.Name)
		gauge(descSamples, q.Samples, q.Name)
	}
	eps := 0.0
	if a := rt.cfg.Admission; a.Mode == modeKV && a.Reservation == admission.Predicted {
		eps = a.epsilon()
	}
	gauge(descEpsilon, eps)
	for _, b := range rt.pool.Backends() {
		up := 0.0
		state := b.State()
		if state != backends.StateOpen {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, up, b.Name(), string(state))
		if kv, ok := b.KV(); ok {
			if kv.HasUsage {
				ch <- prometheus.MustNewConstMetric(descUsage, prometheus.GaugeValue, kv.Usage, b.Name())
			}
			ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, kv.Running, b.Name())
			ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, kv.Waiting, b.Name())
			ch <- prometheus.MustNewConstMetric(descPreempt, prometheus.GaugeValue, kv.Preemptions, b.Name())
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Shared budget (shared_budget): this replica's leases on each GPU's
// budget and its round trips to Redis. Registered only when the gateway
// runs as a replica of a fleet; the lessees' counters are read at scrape
// time, like the budgets above.

var (
	descLeaseHeld     = prometheus.NewDesc("kvgate_lease_held_bytes", "This replica's lease on a GPU's shared budget, as Redis last answered (requests, in admission mode count).", []string{"gpu"}, nil)
	descLeaseCapacity = prometheus.NewDesc("kvgate_lease_capacity_bytes", "What this replica may commit on a GPU under the shared budget: its lease, or its static share while Redis is unreachable.", []string{"gpu"}, nil)
	descLeaseFleet    = prometheus.NewDesc("kvgate_lease_fleet_held_bytes", "All replicas' live leases on a GPU's shared budget, at this replica's last call to Redis.", []string{"gpu"}, nil)
	descLeaseBudget   = prometheus.NewDesc("kvgate_lease_budget_bytes", "A GPU's shared budget in Redis: the smallest that a live replica announces.", []string{"gpu"}, nil)
	descLeaseGrants   = prometheus.NewDesc("kvgate_lease_grants_total", "Lease requests to Redis that granted something.", []string{"gpu"}, nil)
	descLeaseDenials  = prometheus.NewDesc("kvgate_lease_denials_total", "Lease requests to Redis that granted nothing: the budget was fully leased.", []string{"gpu"}, nil)
	descLeaseErrors   = prometheus.NewDesc("kvgate_lease_errors_total", "Calls to Redis for a GPU's lease that failed.", []string{"gpu"}, nil)
	descLeaseLost     = prometheus.NewDesc("kvgate_lease_lost_total", "Times Redis held less of this replica's lease than it counted (Redis restarted empty, or the replica stalled past its TTL).", []string{"gpu"}, nil)
	descLeaseFair     = prometheus.NewDesc("kvgate_lease_fair_share_bytes", "The max-min fair level of a GPU's shared budget over the live replicas' demands, which this replica admits no more than; absent while the demands fit the budget.", []string{"gpu"}, nil)
	descFallback      = prometheus.NewDesc("kvgate_shared_budget_fallback", "1 while this replica cannot reach Redis and admits on its static share of a GPU's budget (budget / replicas), 0 otherwise.", []string{"gpu"}, nil)
)

// redisRTT is the latency histogram of the round trips to Redis, fed by
// leases.RedisOptions.Observe and the lengths sharer.
type redisRTT struct{ h *prometheus.HistogramVec }

func newRedisRTT() *redisRTT {
	return &redisRTT{h: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvgate_redis_round_trip_seconds", Help: "Round trips to Redis for the shared budget, by operation (acquire, renew, release, list, demand, lengths) and result (ok, error).",
		Buckets: prometheus.ExponentialBucketsRange(0.00005, 2, 16),
	}, []string{"op", "result"})}
}

func (r *redisRTT) observe(op string, took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	r.h.WithLabelValues(op, result).Observe(took.Seconds())
}

// fleetCollector reads the lessees at scrape time.
type fleetCollector struct{ f *fleet }

func (c fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLeaseHeld, descLeaseCapacity, descLeaseFleet, descLeaseBudget,
		descLeaseGrants, descLeaseDenials, descLeaseErrors, descLeaseLost, descFallback, descLeaseFair} {
		ch <- d
	}
}

func (c fleetCollector) Collect(ch chan<- prometheus.Metric) {
	for _, ls := range c.f.statuses() {
		s := ls.stats
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, ls.gpu)
		}
		counter := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), ls.gpu)
		}
		gauge(descLeaseHeld, float64(s.Leased))
		gauge(descLeaseCapacity, float64(s.Capacity))
		gauge(descLeaseFleet, float64(s.FleetLeased))
		gauge(descLeaseBudget, float64(s.Budget))
		gauge(descFallback, b2f(s.Fallback))
		if ls.level >= 0 {
			gauge(descLeaseFair, float64(ls.level))
		}
		counter(descLeaseGrants, s.Grants)
		counter(descLeaseDenials, s.Denials)
		counter(descLeaseErrors, s.Failures)
		counter(descLeaseLost, s.LostLeases)
	}
}
