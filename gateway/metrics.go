package gateway

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/fleet"
	"github.com/kvgate/kvgate/backends"
)

// Metric naming, the rules a dashboard relies on (docs/METRICS.md lists
// every series; TestMetricsMatchDocs and TestMetricNamingRules hold the
// code to both):
//   - names are kvgate_<what>_<unit>, snake case, base units (seconds,
//     bytes, ratio); counters end in _total, nothing else does; no colons
//     (those are for recording rules);
//   - a state is never a label whose value changes on one series: it is a
//     0/1 gauge (kvgate_backend_up) or one 0/1 series per state, exactly
//     one of them 1 (kvgate_backend_state);
//   - every labelled series a dashboard plots exists, at zero, from the
//     moment its model, GPU, class, tenant, backend or reason is
//     configured, so rate() and sum() show no gaps and a panel is never
//     "no data" for a class that simply had no traffic yet.
//
// Adding a series is one def line below (and its registration or its
// Collect line), one row in docs/METRICS.md, and the code that feeds it.

// metrics are the gateway's Prometheus series, on a registry of its own.
// Budgets and backends are read at scrape time from the current runtime, so
// a reload needs no re-registration.
type metrics struct {
	reg     *prometheus.Registry
	current func() *runtime

	requests         *prometheus.CounterVec
	admissions       *prometheus.CounterVec
	admissionRejects *prometheus.CounterVec
	queueWait        *prometheus.HistogramVec
	backfilled       *prometheus.CounterVec
	outPredicted     *prometheus.CounterVec
	outGenerated     *prometheus.CounterVec
	tokensPredicted  *prometheus.CounterVec
	tokensActual     *prometheus.CounterVec
	promptRatio      *prometheus.HistogramVec
	ttft             *prometheus.HistogramVec
	itl              *prometheus.HistogramVec
	duration         *prometheus.HistogramVec
	upstreamErrors   *prometheus.CounterVec
	tokenizeFalls    *prometheus.CounterVec
	reloads          *prometheus.CounterVec
	lastReloadOK     prometheus.Gauge
	lastReloadTime   prometheus.Gauge
	inflight         prometheus.Gauge
	overflows        *prometheus.CounterVec

	// series caches each configured model's children of the request
	// path's vectors (model name → *modelSeries). WithLabelValues hashes
	// its labels and takes the vector's lock on every call, and an answered
	// request made about ten such calls.
	series sync.Map
	// tokens caches the token counters of each configured model and
	// tenant (tenantModel → *tokenSeries), for the same reason.
	tokens sync.Map
}

// tenantModel keys the series of one model's requests from one tenant.
type tenantModel struct{ model, tenant string }

// tokenSeries are kvgate_tokens_{predicted,actual}_total of one model and
// tenant: [0] prompt, [1] output.
type tokenSeries struct{ predicted, actual [2]prometheus.Counter }

// forTenant returns the token series of a configured model and a tenant of
// the running configuration ("" anonymous): both are bounded by the
// configuration, so the series are too.
func (m *metrics) forTenant(model, tenant string) *tokenSeries {
	k := tenantModel{model, tenant}
	if v, ok := m.tokens.Load(k); ok {
		return v.(*tokenSeries)
	}
	s := &tokenSeries{}
	for i, kind := range tokenKinds {
		s.predicted[i] = m.tokensPredicted.WithLabelValues(model, kind, tenant)
		s.actual[i] = m.tokensActual.WithLabelValues(model, kind, tenant)
	}
	v, _ := m.tokens.LoadOrStore(k, s)
	return v.(*tokenSeries)
}

// modelSeries are one model's series that every answered request updates.
type modelSeries struct {
	ok           prometheus.Counter  // requests{outcome="ok", reason=""}
	okDur        prometheus.Observer // duration{outcome="ok"}
	outPredicted prometheus.Counter
	outGenerated prometheus.Counter
	ttft         prometheus.Observer
	itl          prometheus.Observer
	ratio        map[string]prometheus.Observer // by the count's source; read-only
}

// promptSources are the values of kvgate_prompt_tokens_actual_over_predicted's
// tokenizer label: where a request's prompt count came from.
var promptSources = []string{sourceBackend, sourceCache, sourceEstimate}

// forModel returns the series of a configured model (never of a name a
// client sent: those are not bounded).
func (m *metrics) forModel(name string) *modelSeries {
	if v, ok := m.series.Load(name); ok {
		return v.(*modelSeries)
	}
	s := &modelSeries{
		ok:           m.requests.WithLabelValues(name, outcomeOK, ""),
		okDur:        m.duration.WithLabelValues(name, outcomeOK),
		outPredicted: m.outPredicted.WithLabelValues(name),
		outGenerated: m.outGenerated.WithLabelValues(name),
		ttft:         m.ttft.WithLabelValues(name),
		itl:          m.itl.WithLabelValues(name),
		ratio:        map[string]prometheus.Observer{},
	}
	for _, src := range promptSources {
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

// reasonGuard is the reason (and error code) of a request the admission
// guard stopped: the GPU's running requests outgrew their forecast.
const reasonGuard = "kv_guard_stopped"

// requestReasons are the reasons of kvgate_requests_total, by outcome, that
// exist at zero for every model. A backend's own status (backend_503, ...)
// is open-ended and appears when it first happens.
// TestRequestReasonsCoverTheCode keeps this list in step with proxy.go.
var requestReasons = map[string][]string{
	outcomeOK:       {""},
	outcomeShed:     {admission.ReasonQueueFull, admission.ReasonQueueTimeout, admission.ReasonOverloaded, admission.ReasonTenantQuota, reasonGuard},
	outcomeRejected: {"unauthorized", "invalid_request", "unknown_model", "context_length_exceeded", "kv_budget_exceeded"},
	outcomeFailed: {"no_backend", "upstream_error", "request_timeout", "first_byte_timeout", "shutdown", "backend_stream_error",
		"upstream_incomplete", "upstream_event_too_large", "internal"},
	outcomeCanceled: {"client_disconnect"},
}

// Label values that exist from the start.
var (
	tokenKinds          = []string{"prompt", "output"}
	upstreamErrorKinds  = []string{"transport", "status", "tokenize"}
	reloadResults       = []string{"ok", "error"}
	tokenizeFallbacks   = []string{"timeout", "error"}
	circuitStates       = []backends.CircuitState{backends.StateClosed, backends.StateHalfOpen, backends.StateOpen}
	waitResultsSeeded   = []string{"admitted", admission.ReasonQueueTimeout, admission.ReasonCanceled}
	admissionRejections = append(admission.Reasons(), admission.ReasonCanceled)
)

// def is one series family: its name, help and label names.
type def struct {
	name, help string
	labels     []string
}

func (d def) counterVec() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: d.name, Help: d.help}, d.labels)
}

func (d def) histogramVec(buckets []float64) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: d.name, Help: d.help, Buckets: buckets}, d.labels)
}

func (d def) gauge() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: d.name, Help: d.help})
}

func (d def) desc() *prometheus.Desc { return prometheus.NewDesc(d.name, d.help, d.labels, nil) }

// The series fed as requests pass.
var (
	defRequests         = def{"kvgate_requests_total", "Requests by model, outcome (ok, shed, rejected, failed, canceled) and reason.", []string{"model", "outcome", "reason"}}
	defAdmissions       = def{"kvgate_admissions_total", "Requests admitted to a GPU's KV budget, by class, tenant and whether they queued first.", []string{"gpu", "class", "tenant", "queued"}}
	defAdmissionRejects = def{"kvgate_admission_rejections_total", "Requests the admission of a model's queue refused, by class, tenant and reason (too_large, queue_full, queue_timeout, overloaded, tenant_quota, no_route, canceled).", []string{"model", "class", "tenant", "reason"}}
	defQueueWait        = def{"kvgate_queue_wait_seconds", "Time requests spent in their model's admission queue, by how the wait ended (admitted or a rejection reason).", []string{"model", "class", "result"}}
	defBackfilled       = def{"kvgate_admission_backfilled_total", "Requests admitted past an earlier request that did not fit, without delaying its expected start (EASY backfilling).", []string{"model", "gpu"}}
	defOutPredicted     = def{"kvgate_output_tokens_predicted_total", "Output tokens predicted at admission for requests that finished: the learned median length, capped by max_tokens (max_tokens itself while the model warms up or under worst_case).", []string{"model"}}
	defOutGenerated     = def{"kvgate_output_tokens_generated_total", "Output tokens the same requests really generated.", []string{"model"}}
	defTokensPredicted  = def{"kvgate_tokens_predicted_total", "Tokens the gateway reserved KV for: prompt (predicted) and output (max_tokens), of answered requests, by tenant (\"\" is anonymous).", []string{"model", "kind", "tenant"}}
	defTokensActual     = def{"kvgate_tokens_actual_total", "Tokens backends reported in usage for the same requests, by tenant (\"\" is anonymous).", []string{"model", "kind", "tenant"}}
	defPromptRatio      = def{"kvgate_prompt_tokens_actual_over_predicted", "Actual / predicted prompt tokens per request: above 1 the prediction was low. tokenizer is where the count came from: backend (its /tokenize, asked now), cache (an earlier /tokenize answer), estimate.", []string{"model", "tokenizer"}}
	defTTFT             = def{"kvgate_time_to_first_token_seconds", "Arrival to the first generated token of a stream (content, reasoning or a piece of a tool call) relayed to the client, queueing included.", []string{"model"}}
	defITL              = def{"kvgate_inter_token_latency_seconds", "Time between successive streamed events carrying a token of a stream's first choice, relayed to the client (an event may carry several tokens when the backend batches them).", []string{"model"}}
	defDuration         = def{"kvgate_request_duration_seconds", "Arrival to last byte, by outcome.", []string{"model", "outcome"}}
	defUpstreamErrors   = def{"kvgate_upstream_errors_total", "Failures talking to backends: transport, status (5xx answers), tokenize.", []string{"backend", "kind"}}
	defTokenizeFalls    = def{"kvgate_tokenize_fallbacks_total", "Prompts estimated because the backend's /tokenize failed, by reason (timeout: past backends[].tokenize_timeout; error).", []string{"model", "reason"}}
	defReloads          = def{"kvgate_config_reloads_total", "Configuration reloads by result (ok, error); a file that fails to load counts as error.", []string{"result"}}
	defLastReloadOK     = def{"kvgate_config_last_reload_successful", "1 if the last configuration reload (or the start) succeeded, 0 while the running config is older than a file that failed to load.", nil}
	defLastReloadTime   = def{"kvgate_config_last_reload_success_timestamp_seconds", "Unix time of the last successful configuration load (the start counts).", nil}
	defInflight         = def{"kvgate_requests_in_flight", "Requests between arrival and last byte.", nil}
	defOverflows        = def{"kvgate_backend_overflows_total", "Out-of-memory errors a GPU's backends answered with (each puts the GPU on worst-case admission for admission.cool_down).", []string{"gpu"}}
)

// The series read from the scheduler and the backends at scrape time.
var (
	descCapacity   = def{"kvgate_kv_capacity_bytes", "KV budget of a GPU: memory × ceiling − weights − reserve, clamped to the backend's reported pool (requests, in admission mode count).", []string{"gpu"}}.desc()
	descEffective  = def{"kvgate_kv_effective_capacity_bytes", "KV budget of a GPU after the feedback loop.", []string{"gpu"}}.desc()
	descHeld       = def{"kvgate_kv_held_bytes", "Worst case of the requests bound to a GPU (prompt + max_tokens, minus finished sequences).", []string{"gpu"}}.desc()
	descCommitted  = def{"kvgate_kv_committed_bytes", "What admissions to a GPU are measured against: the held worst case, or under the predicted policy the forecast peak of its batch's memory.", []string{"gpu"}}.desc()
	descUsed       = def{"kvgate_kv_used_bytes", "KV bytes a GPU's backends report in use (vllm:kv_cache_usage_perc × their pool); 0 until they have reported.", []string{"gpu"}}.desc()
	descBound      = def{"kvgate_kv_bound_requests", "Requests bound to a GPU (admitted, not yet released).", []string{"gpu"}}.desc()
	descGated      = def{"kvgate_kv_headroom_gate", "1 while a GPU's backends report more than (1 − headroom) × its budget in use, so nothing new is admitted to it.", []string{"gpu"}}.desc()
	descDrain      = def{"kvgate_kv_drain_rate_bytes_per_second", "Measured release rate per busy second behind Retry-After.", []string{"gpu"}}.desc()
	descQueued     = def{"kvgate_kv_queued_bytes", "Worst-case KV bytes of the requests waiting for a model.", []string{"model"}}.desc()
	descDepth      = def{"kvgate_queue_depth", "Requests waiting for admission, per model and class.", []string{"model", "class"}}.desc()
	descClassHeld  = def{"kvgate_class_kv_held_bytes", "Worst case of the requests a model's class has admitted and not released.", []string{"model", "class"}}.desc()
	descPredicting = def{"kvgate_admission_predicting", "1 when a model's requests are admitted by their predicted growth (past the warm-up), 0 while held at their worst case.", []string{"model"}}.desc()
	descSamples    = def{"kvgate_admission_length_samples", "Finished sequences a model's output-length predictor rests on (decayed).", []string{"model"}}.desc()
	descEpsilon    = def{"kvgate_admission_epsilon", "The bound on the probability that a GPU's real KV use passes its budget, per admission, under the predicted policy (0 under worst_case and count).", nil}.desc()
	descTenantHeld = def{"kvgate_tenant_kv_held_bytes", "What a tenant's admitted requests hold, every GPU together (tenant \"\" is anonymous).", []string{"tenant"}}.desc()
	descTenantQ    = def{"kvgate_tenant_queue_depth", "A tenant's requests waiting for admission.", []string{"tenant"}}.desc()
	descUp         = def{"kvgate_backend_up", "1 if requests are routed to the backend (circuit closed or half-open), else 0.", []string{"backend"}}.desc()
	descState      = def{"kvgate_backend_state", "The backend's circuit: one series per state (closed, half-open, open), the current one 1, the others 0.", []string{"backend", "state"}}.desc()
	descScraped    = def{"kvgate_backend_last_report_timestamp_seconds", "Unix time of the backend's last /metrics report the gateway read; 0 before the first.", []string{"backend"}}.desc()
	descUsage      = def{"kvgate_backend_kv_usage_ratio", "KV cache usage the backend reports (vllm:kv_cache_usage_perc), 0–1; 0 before its first report.", []string{"backend"}}.desc()
	descRunning    = def{"kvgate_backend_requests_running", "Requests the backend reports running.", []string{"backend"}}.desc()
	descWaiting    = def{"kvgate_backend_requests_waiting", "Requests the backend reports waiting.", []string{"backend"}}.desc()
	descPreempt    = def{"kvgate_backend_preemptions_total", "Preemptions the backend reports (its vllm:num_preemptions_total, so it resets when the backend restarts).", []string{"backend"}}.desc()
	descTokLookups = def{"kvgate_tokenize_cache_lookups_total", "Prompts looked up in a model's cache of /tokenize answers, by result: hit (counted without a round trip) or miss (the backend was asked).", []string{"model", "result"}}.desc()
	descTokStale   = def{"kvgate_tokenize_cache_stale_total", "Cached prompt counts dropped because the backend's usage reported another length (its tokenizer changed).", []string{"model"}}.desc()
	descTokEntries = def{"kvgate_tokenize_cache_entries", "Prompt counts a model's tokenize cache holds.", []string{"model"}}.desc()
	descRunningKV  = def{"kvgate_kv_running_bytes", "What the requests bound to a GPU may hold on it now: prompt and tokens generated plus a block of lead for streams, the worst case for the rest (the guard's account, kept within the budget).", []string{"gpu"}}.desc()
	descStops      = def{"kvgate_admission_guard_stops_total", "Running streams the admission guard stopped to keep a GPU within its KV budget when they outgrew their forecast.", nil}.desc()
	descTrips      = def{"kvgate_admission_forecast_trips_total", "Times a model's forecast was distrusted (its GPU back on worst-case admission for admission.cool_down, its learning started over), by reason: drift (sequences outlived their forecast), guard (a stream had to be stopped), overflow (a backend ran out of KV memory or preempted).", []string{"reason"}}.desc()
	descDistrust   = def{"kvgate_admission_distrusted", "1 while a model's forecast is distrusted (cool-down: its requests are held at their worst case).", []string{"model"}}.desc()
)

// itlBuckets are vLLM's own for its inter-token latency
// (vllm:inter_token_latency_seconds), from a millisecond, so that the two
// read side by side.
var itlBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}

func newMetrics(current func() *runtime, now func() time.Time) *metrics {
	reg := prometheus.NewRegistry()
	latency := prometheus.ExponentialBucketsRange(0.005, 300, 20)
	m := &metrics{
		reg:              reg,
		current:          current,
		requests:         defRequests.counterVec(),
		admissions:       defAdmissions.counterVec(),
		admissionRejects: defAdmissionRejects.counterVec(),
		queueWait:        defQueueWait.histogramVec(prometheus.ExponentialBucketsRange(0.001, 120, 18)),
		backfilled:       defBackfilled.counterVec(),
		outPredicted:     defOutPredicted.counterVec(),
		outGenerated:     defOutGenerated.counterVec(),
		tokensPredicted:  defTokensPredicted.counterVec(),
		tokensActual:     defTokensActual.counterVec(),
		promptRatio:      defPromptRatio.histogramVec([]float64{0.5, 0.7, 0.8, 0.9, 0.95, 1, 1.02, 1.05, 1.1, 1.2, 1.5, 2}),
		ttft:             defTTFT.histogramVec(latency),
		itl:              defITL.histogramVec(itlBuckets),
		duration:         defDuration.histogramVec(latency),
		upstreamErrors:   defUpstreamErrors.counterVec(),
		tokenizeFalls:    defTokenizeFalls.counterVec(),
		reloads:          defReloads.counterVec(),
		lastReloadOK:     defLastReloadOK.gauge(),
		lastReloadTime:   defLastReloadTime.gauge(),
		inflight:         defInflight.gauge(),
		overflows:        defOverflows.counterVec(),
	}
	m.lastReloadOK.Set(1)
	m.lastReloadTime.Set(float64(now().UnixNano()) / 1e9)
	reg.MustRegister(
		&seededCollector{m: m, current: current},
		m.lastReloadOK, m.lastReloadTime, m.inflight,
		&stateCollector{current: current},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// reloaded records the result of a configuration reload.
func (m *metrics) reloaded(ok bool, now time.Time) {
	if !ok {
		m.reloads.WithLabelValues("error").Inc()
		m.lastReloadOK.Set(0)
		return
	}
	m.reloads.WithLabelValues("ok").Inc()
	m.lastReloadOK.Set(1)
	m.lastReloadTime.Set(float64(now.UnixNano()) / 1e9)
}

// seededCollector gathers the labelled counters and histograms, first
// creating, at zero, every series the current configuration names. It runs
// the seeding inside its own Collect so that a scrape never sees a runtime
// whose series are not there yet; the seeding runs once per runtime.
type seededCollector struct {
	m       *metrics
	current func() *runtime
	seeded  atomic.Pointer[runtime]
}

func (c *seededCollector) vecs() []prometheus.Collector {
	m := c.m
	return []prometheus.Collector{m.requests, m.admissions, m.admissionRejects, m.queueWait, m.backfilled,
		m.outPredicted, m.outGenerated, m.tokensPredicted, m.tokensActual, m.promptRatio, m.ttft, m.itl, m.duration,
		m.upstreamErrors, m.tokenizeFalls, m.reloads, m.overflows}
}

func (c *seededCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vecs() {
		v.Describe(ch)
	}
}

func (c *seededCollector) Collect(ch chan<- prometheus.Metric) {
	if rt := c.current(); rt != nil && c.seeded.Load() != rt {
		c.m.seed(rt)
		c.seeded.Store(rt)
	}
	for _, v := range c.vecs() {
		v.Collect(ch)
	}
}

// seed creates every series rt's configuration names. Series of models,
// backends or tenants a reload removed stay, as counters should.
func (m *metrics) seed(rt *runtime) {
	for _, r := range reloadResults {
		m.reloads.WithLabelValues(r)
	}
	tenants := rt.tenantNames()
	// Requests refused before their model is known count under "unknown".
	for _, name := range append([]string{"unknown"}, rt.modelOrder...) {
		for outcome, reasons := range requestReasons {
			for _, r := range reasons {
				m.requests.WithLabelValues(name, outcome, r)
			}
			m.duration.WithLabelValues(name, outcome)
		}
		md := rt.models[name]
		if md == nil {
			continue
		}
		for _, t := range tenants {
			m.forTenant(name, t)
		}
		m.outPredicted.WithLabelValues(name)
		m.outGenerated.WithLabelValues(name)
		for _, src := range md.promptSources() {
			m.promptRatio.WithLabelValues(name, src)
		}
		m.ttft.WithLabelValues(name)
		m.itl.WithLabelValues(name)
		for _, r := range tokenizeFallbacks {
			m.tokenizeFalls.WithLabelValues(name, r)
		}
		for _, cl := range rt.cfg.Admission.Classes {
			for _, r := range waitResultsSeeded {
				m.queueWait.WithLabelValues(name, cl.Name, r)
			}
			for _, t := range tenants {
				for _, r := range admissionRejections {
					m.admissionRejects.WithLabelValues(name, cl.Name, t, r)
				}
			}
		}
		for gpu, g := range rt.groups {
			for _, be := range g.backends {
				if be.Serves(name) {
					m.backfilled.WithLabelValues(name, gpu)
					break
				}
			}
		}
	}
	for _, be := range rt.pool.Backends() {
		for _, k := range upstreamErrorKinds {
			m.upstreamErrors.WithLabelValues(be.Name(), k)
		}
	}
	for gpu := range rt.groups {
		m.overflows.WithLabelValues(gpu)
		for _, cl := range rt.cfg.Admission.Classes {
			for _, t := range tenants {
				m.admissions.WithLabelValues(gpu, cl.Name, t, "false")
				m.admissions.WithLabelValues(gpu, cl.Name, t, "true")
			}
		}
	}
}

// tenantNames are the tenants requests can come from: the configured ones,
// and "" (anonymous) where no API key is required.
func (rt *runtime) tenantNames() []string {
	var out []string
	if !rt.auth {
		out = append(out, "")
	}
	for _, t := range rt.cfg.Tenants {
		out = append(out, t.Name)
	}
	return out
}

// observer feeds the scheduler's admissions into the metrics. Labels name
// the GPU as the configuration does (a pool keeps its first GPU's name
// across a rename, see group.pool).
type observer struct{ m *metrics }

func (o observer) gpu(pool string) string {
	if rt := o.m.current(); rt != nil {
		if g := rt.poolGroup[pool]; g != nil {
			return g.name
		}
	}
	return pool
}

func (o observer) Admitted(e admission.Event) {
	queued := "false"
	if e.Waited > 0 {
		queued = "true"
		o.m.queueWait.WithLabelValues(e.Queue, e.Class, "admitted").Observe(e.Waited.Seconds())
	}
	gpu := o.gpu(e.Pool)
	o.m.admissions.WithLabelValues(gpu, e.Class, e.Tenant, queued).Inc()
	if e.Backfilled {
		o.m.backfilled.WithLabelValues(e.Queue, gpu).Inc()
	}
}

func (o observer) Rejected(e admission.Event, reason string) {
	if e.Waited > 0 {
		o.m.queueWait.WithLabelValues(e.Queue, e.Class, reason).Observe(e.Waited.Seconds())
	}
	o.m.admissionRejects.WithLabelValues(e.Queue, e.Class, e.Tenant, reason).Inc()
}

// stateCollector reads the scheduler and the backends at scrape time.
type stateCollector struct{ current func() *runtime }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCapacity, descEffective, descHeld, descCommitted, descUsed, descBound, descGated,
		descDrain, descQueued, descDepth, descClassHeld, descPredicting, descSamples, descEpsilon, descTenantHeld, descTenantQ,
		descUp, descState, descScraped, descUsage, descRunning, descWaiting, descPreempt,
		descTokLookups, descTokStale, descTokEntries, descRunningKV, descStops, descTrips, descDistrust} {
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
		gpu, ok := gpuOf[p.Name]
		if !ok {
			continue // a pool no GPU of this configuration uses any more
		}
		gauge(descCapacity, float64(p.Capacity), gpu)
		gauge(descEffective, float64(p.Effective), gpu)
		gauge(descHeld, float64(p.Held), gpu)
		gauge(descCommitted, float64(p.Committed), gpu)
		gauge(descUsed, float64(p.Used), gpu) // 0 until reported (p.UsedKnown)
		gauge(descBound, float64(p.Tickets), gpu)
		gauge(descGated, boolFloat(p.Gated), gpu)
		gauge(descDrain, p.DrainRate, gpu)
		gauge(descRunningKV, float64(p.Now), gpu)
	}
	ch <- prometheus.MustNewConstMetric(descStops, prometheus.CounterValue, float64(st.GuardStops))
	for reason, n := range st.Trips {
		ch <- prometheus.MustNewConstMetric(descTrips, prometheus.CounterValue, float64(n), reason)
	}
	for _, q := range st.Queues {
		gauge(descQueued, float64(q.QueuedBytes), q.Name)
		for _, cl := range q.Classes {
			gauge(descDepth, float64(cl.Queued), q.Name, cl.Name)
			gauge(descClassHeld, float64(cl.Held), q.Name, cl.Name)
		}
		gauge(descPredicting, boolFloat(q.Predicting), q.Name)
		gauge(descSamples, q.Samples, q.Name)
		gauge(descDistrust, boolFloat(q.Distrusted), q.Name)
	}
	eps := 0.0
	if a := rt.cfg.Admission; a.Mode == modeKV && a.Reservation == admission.Predicted {
		eps = a.epsilon()
	}
	gauge(descEpsilon, eps)
	for _, t := range st.Tenants {
		gauge(descTenantHeld, float64(t.Held), t.Name)
		gauge(descTenantQ, float64(t.Queued), t.Name)
	}
	for _, b := range rt.pool.Backends() {
		state := b.State()
		gauge(descUp, boolFloat(state != backends.StateOpen), b.Name())
		for _, s := range circuitStates {
			gauge(descState, boolFloat(s == state), b.Name(), string(s))
		}
		kv, ok := b.KV()
		at := 0.0
		if ok {
			at = float64(kv.At.UnixNano()) / 1e9
		}
		gauge(descScraped, at, b.Name())
		gauge(descUsage, kv.Usage, b.Name())
		gauge(descRunning, kv.Running, b.Name())
		gauge(descWaiting, kv.Waiting, b.Name())
		ch <- prometheus.MustNewConstMetric(descPreempt, prometheus.CounterValue, kv.Preemptions, b.Name())
	}
	for _, name := range rt.modelOrder {
		if tc := rt.models[name].tokens; tc != nil {
			ch <- prometheus.MustNewConstMetric(descTokLookups, prometheus.CounterValue, float64(tc.hits.Load()), name, "hit")
			ch <- prometheus.MustNewConstMetric(descTokLookups, prometheus.CounterValue, float64(tc.misses.Load()), name, "miss")
			ch <- prometheus.MustNewConstMetric(descTokStale, prometheus.CounterValue, float64(tc.stale.Load()), name)
			gauge(descTokEntries, float64(tc.len()), name)
		}
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Shared budget (shared_budget): this replica's leases on each GPU's
// budget and its round trips to Redis. Registered only when the gateway
// runs as a replica of a fleet (docs/METRICS.md lists them in a section of
// their own); the lessees' counters are read at scrape time, like the
// budgets above.

var (
	descLeaseHeld     = def{"kvgate_lease_held_bytes", "This replica's lease on a GPU's shared budget, as Redis last answered (requests, in admission mode count).", []string{"gpu"}}.desc()
	descLeaseCapacity = def{"kvgate_lease_capacity_bytes", "What this replica may commit on a GPU under the shared budget: its lease, or its static share while Redis is unreachable.", []string{"gpu"}}.desc()
	descLeaseFleet    = def{"kvgate_lease_fleet_held_bytes", "All replicas' live leases on a GPU's shared budget, at this replica's last call to Redis.", []string{"gpu"}}.desc()
	descLeaseBudget   = def{"kvgate_lease_budget_bytes", "A GPU's shared budget in Redis: the smallest that a live replica announces.", []string{"gpu"}}.desc()
	descLeaseFair     = def{"kvgate_lease_fair_share_bytes", "The max-min fair level of a GPU's shared budget over the live replicas' demands, which this replica admits no more than; 0 while the demands fit the budget.", []string{"gpu"}}.desc()
	descLeaseGrants   = def{"kvgate_lease_grants_total", "Lease requests to Redis that granted something.", []string{"gpu"}}.desc()
	descLeaseDenials  = def{"kvgate_lease_denials_total", "Lease requests to Redis that granted nothing: the budget was fully leased.", []string{"gpu"}}.desc()
	descLeaseErrors   = def{"kvgate_lease_errors_total", "Calls to Redis for a GPU's lease that failed.", []string{"gpu"}}.desc()
	descLeaseLost     = def{"kvgate_lease_lost_total", "Times Redis held less of this replica's lease than it counted (Redis restarted empty, or the replica stalled past its TTL).", []string{"gpu"}}.desc()
	descFallback      = def{"kvgate_shared_budget_fallback", "1 while this replica cannot reach Redis and admits on its static share of a GPU's budget (budget / replicas), 0 otherwise.", []string{"gpu"}}.desc()
	defRedisRTT       = def{"kvgate_redis_round_trip_seconds", "Round trips to Redis for the shared budget, by operation (acquire, renew, release, list, demand, lengths) and result (ok, error).", []string{"op", "result"}}
)

// Label values of kvgate_redis_round_trip_seconds, which exist from the start.
var (
	redisOps     = []string{"acquire", "renew", "release", "list", "demand", "lengths"}
	redisResults = []string{"ok", "error"}
)

// redisRTT is the latency histogram of the round trips to Redis, fed by
// fleet.Deps.Observe: the leases, the fair-share board and the lengths sharer.
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

// fleetCollector reads the lessees at scrape time.
type fleetCollector struct{ f *fleet.Fleet }

func (c fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLeaseHeld, descLeaseCapacity, descLeaseFleet, descLeaseBudget, descLeaseFair,
		descLeaseGrants, descLeaseDenials, descLeaseErrors, descLeaseLost, descFallback} {
		ch <- d
	}
}

func (c fleetCollector) Collect(ch chan<- prometheus.Metric) {
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
	}
}
