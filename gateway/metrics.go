package gateway

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvgate/kvgate/admission"
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
	preemptive       *prometheus.CounterVec
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
	resumed          *prometheus.CounterVec
	mergedEvents     *prometheus.CounterVec

	// series caches each configured model's children of the request
	// path's vectors (model name → *modelSeries). WithLabelValues hashes
	// its labels and takes the vector's lock on every call, and an answered
	// request made about ten such calls.
	series sync.Map
	// tokens caches the token counters of each configured model and
	// tenant (tenantModel → *tokenSeries), for the same reason.
	tokens sync.Map
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
// TestRequestReasonsCoverTheCode keeps this list in step with the code.
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
	defPreemptive       = def{"kvgate_admission_preemptive_total", "Requests of a higher class admitted on room that resumable streams of lower classes hold, which the guard stops if it is needed (admission.preemption).", []string{"model", "gpu"}}
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
	defMergedEvents     = def{"kvgate_stream_events_merged_total", "Times a backend's streams of a model were found to carry several tokens an event (a final usage above the events counted): its streams are counted by bytes of text from then on.", []string{"model", "backend"}}
	defResumed          = def{"kvgate_streams_resumed_total", "Streams the admission guard stopped that were sent again from where they were (admission.resume_stopped): their clients saw a pause, not an error.", []string{"model"}}
	defOverflows        = def{"kvgate_backend_overflows_total", "Out-of-memory errors a GPU's backends answered with (each puts the GPU on worst-case admission for admission.cool_down).", []string{"gpu"}}
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
		preemptive:       defPreemptive.counterVec(),
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
		resumed:          defResumed.counterVec(),
		mergedEvents:     defMergedEvents.counterVec(),
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
