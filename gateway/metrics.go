package gateway

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

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

	// series caches each configured model's children of the request
	// path's vectors (model name → *modelSeries). WithLabelValues hashes
	// its labels and takes the vector's lock on every call, and a request
	// made eight such calls.
	series sync.Map
}

// modelSeries are one model's series that every answered request updates.
type modelSeries struct {
	ok        prometheus.Counter  // requests{outcome="ok", reason=""}
	okDur     prometheus.Observer // duration{outcome="ok"}
	predicted [2]prometheus.Counter
	actual    [2]prometheus.Counter // [0] prompt, [1] output
	ttft      prometheus.Observer
	ratio     map[string]prometheus.Observer // by the count's source; read-only
}

// forModel returns the series of a configured model (never of a name a
// client sent: those are not bounded).
func (m *metrics) forModel(name string) *modelSeries {
	if v, ok := m.series.Load(name); ok {
		return v.(*modelSeries)
	}
	s := &modelSeries{
		ok:        m.requests.WithLabelValues(name, outcomeOK, ""),
		okDur:     m.duration.WithLabelValues(name, outcomeOK),
		predicted: [2]prometheus.Counter{m.tokensPredicted.WithLabelValues(name, "prompt"), m.tokensPredicted.WithLabelValues(name, "output")},
		actual:    [2]prometheus.Counter{m.tokensActual.WithLabelValues(name, "prompt"), m.tokensActual.WithLabelValues(name, "output")},
		ttft:      m.ttft.WithLabelValues(name),
		ratio:     map[string]prometheus.Observer{},
	}
	for _, src := range []string{sourceBackend, sourceCache, sourceEstimate} {
		s.ratio[src] = m.promptRatio.WithLabelValues(name, src)
	}
	v, _ := m.series.LoadOrStore(name, s)
	return v.(*modelSeries)
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
			Name: "kvgate_admissions_total", Help: "Requests admitted to a KV budget, by whether they queued first.",
		}, []string{"gpu", "class", "queued"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_queue_wait_seconds", Help: "Time requests spent in the admission queue, admitted or not.",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 120, 18),
		}, []string{"gpu", "class", "result"}),
		tokensPredicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_tokens_predicted_total", Help: "Tokens the gateway reserved KV for: prompt (predicted) and output (max_tokens), of answered requests.",
		}, []string{"model", "kind"}),
		tokensActual: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_tokens_actual_total", Help: "Tokens backends reported in usage for the same requests.",
		}, []string{"model", "kind"}),
		promptRatio: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_prompt_tokens_actual_over_predicted", Help: "Actual / predicted prompt tokens per request: above 1 the prediction was low. tokenizer is how the prompt was counted: backend (/tokenize now), cache (an earlier /tokenize answer), estimate.",
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
		m.ttft, m.duration, m.upstreamErrors, m.reloads, m.inflight,
		&stateCollector{current: current},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observer feeds one budget's admissions into the metrics.
type observer struct {
	m   *metrics
	gpu string
	// atOnce caches admissions{gpu, class, queued="false"} by class: the
	// one series every admission that did not wait updates.
	atOnce *sync.Map
}

func (o observer) Admitted(class, _ string, _ int64, waited time.Duration) {
	if waited <= 0 {
		c, ok := o.atOnce.Load(class)
		if !ok {
			c, _ = o.atOnce.LoadOrStore(class, o.m.admissions.WithLabelValues(o.gpu, class, "false"))
		}
		c.(prometheus.Counter).Inc()
		return
	}
	o.m.queueWait.WithLabelValues(o.gpu, class, "admitted").Observe(waited.Seconds())
	o.m.admissions.WithLabelValues(o.gpu, class, "true").Inc()
}

func (o observer) Rejected(class, _, reason string, _ int64, waited time.Duration) {
	if waited > 0 {
		o.m.queueWait.WithLabelValues(o.gpu, class, reason).Observe(waited.Seconds())
	}
}

var (
	descCapacity  = prometheus.NewDesc("kvgate_kv_capacity_bytes", "Nominal KV budget of a GPU: memory × ceiling − weights − reserve, clamped to the backend's reported pool.", []string{"gpu"}, nil)
	descEffective = prometheus.NewDesc("kvgate_kv_effective_capacity_bytes", "KV budget after the feedback loop.", []string{"gpu"}, nil)
	descHeld      = prometheus.NewDesc("kvgate_kv_held_bytes", "KV bytes reserved by admitted requests.", []string{"gpu"}, nil)
	descQueued    = prometheus.NewDesc("kvgate_kv_queued_bytes", "KV bytes of requests waiting for admission.", []string{"gpu"}, nil)
	descDrain     = prometheus.NewDesc("kvgate_kv_drain_rate_bytes_per_second", "Measured release rate behind Retry-After.", []string{"gpu"}, nil)
	descDepth     = prometheus.NewDesc("kvgate_queue_depth", "Requests waiting for admission.", []string{"gpu", "class"}, nil)
	descUp        = prometheus.NewDesc("kvgate_backend_up", "1 if requests are routed to the backend (circuit closed or half-open).", []string{"backend", "state"}, nil)
	descUsage     = prometheus.NewDesc("kvgate_backend_kv_usage_ratio", "KV cache usage the backend reports (vllm:kv_cache_usage_perc).", []string{"backend"}, nil)
	descRunning   = prometheus.NewDesc("kvgate_backend_requests_running", "Requests the backend reports running.", []string{"backend"}, nil)
	descWaiting   = prometheus.NewDesc("kvgate_backend_requests_waiting", "Requests the backend reports waiting.", []string{"backend"}, nil)
	descPreempt   = prometheus.NewDesc("kvgate_backend_preemptions", "Preemptions the backend reports (its counter).", []string{"backend"}, nil)
	descTokLookup = prometheus.NewDesc("kvgate_tokenize_cache_lookups_total", "Prompts looked up in a model's cache of /tokenize answers, by result (hit: counted without a round trip; miss: asked the backend).", []string{"model", "result"}, nil)
	descTokStale  = prometheus.NewDesc("kvgate_tokenize_cache_stale_total", "Cached prompt counts dropped because the backend's usage reported another length.", []string{"model"}, nil)
	descTokSize   = prometheus.NewDesc("kvgate_tokenize_cache_entries", "Prompt counts held in a model's tokenize cache.", []string{"model"}, nil)
)

// stateCollector reads budgets and backends at scrape time.
type stateCollector struct{ current func() *runtime }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCapacity, descEffective, descHeld, descQueued, descDrain, descDepth, descUp, descUsage, descRunning, descWaiting, descPreempt, descTokLookup, descTokStale, descTokSize} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	rt := c.current()
	if rt == nil {
		return
	}
	for name, g := range rt.groups {
		st := g.budget.Stats()
		ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, float64(st.Capacity), name)
		ch <- prometheus.MustNewConstMetric(descEffective, prometheus.GaugeValue, float64(st.Effective), name)
		ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, float64(st.Held), name)
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(st.QueuedBytes), name)
		ch <- prometheus.MustNewConstMetric(descDrain, prometheus.GaugeValue, st.DrainRate, name)
		for _, cl := range st.Classes {
			ch <- prometheus.MustNewConstMetric(descDepth, prometheus.GaugeValue, float64(cl.Queued), name, cl.Name)
		}
	}
	for _, name := range rt.modelOrder {
		if c := rt.models[name].tokens; c != nil {
			ch <- prometheus.MustNewConstMetric(descTokLookup, prometheus.CounterValue, float64(c.hits.Load()), name, "hit")
			ch <- prometheus.MustNewConstMetric(descTokLookup, prometheus.CounterValue, float64(c.misses.Load()), name, "miss")
			ch <- prometheus.MustNewConstMetric(descTokStale, prometheus.CounterValue, float64(c.stale.Load()), name)
			ch <- prometheus.MustNewConstMetric(descTokSize, prometheus.GaugeValue, float64(c.len()), name)
		}
	}
	for _, b := range rt.pool.Backends() {
		up := 0.0
		st := b.State()
		if st != backends.StateOpen {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, up, b.Name(), string(st))
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
