package gateway

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
)

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
	return []prometheus.Collector{m.requests, m.admissions, m.admissionRejects, m.queueWait, m.backfilled, m.preemptive,
		m.outPredicted, m.outGenerated, m.tokensPredicted, m.tokensActual, m.promptRatio, m.ttft, m.itl, m.duration,
		m.upstreamErrors, m.tokenizeFalls, m.reloads, m.overflows, m.resumed, m.mergedEvents}
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
		m.resumed.WithLabelValues(name)
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
		for gpu, g := range rt.gpus {
			for _, be := range g.backends {
				if be.Serves(name) {
					m.backfilled.WithLabelValues(name, gpu)
					m.preemptive.WithLabelValues(name, gpu)
					break
				}
			}
			for _, be := range g.backends {
				if be.Serves(name) {
					m.mergedEvents.WithLabelValues(name, be.Name())
				}
			}
		}
	}
	for _, be := range rt.upstreams.Backends() {
		for _, k := range upstreamErrorKinds {
			m.upstreamErrors.WithLabelValues(be.Name(), k)
		}
	}
	for gpu := range rt.gpus {
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

// The series read from the scheduler and the backends at scrape time.
var (
	descCapacity         = def{"kvgate_kv_capacity_bytes", "KV budget of a GPU: memory × ceiling − weights − reserve, clamped to the backend's reported pool (requests, in admission mode count).", []string{"gpu"}}.desc()
	descEffective        = def{"kvgate_kv_effective_capacity_bytes", "KV budget of a GPU after the feedback loop.", []string{"gpu"}}.desc()
	descHeld             = def{"kvgate_kv_held_bytes", "Worst case of the requests bound to a GPU (prompt + max_tokens, minus finished sequences).", []string{"gpu"}}.desc()
	descCommitted        = def{"kvgate_kv_committed_bytes", "What admissions to a GPU are measured against: the held worst case, or under the predicted policy the forecast peak of its batch's memory.", []string{"gpu"}}.desc()
	descUsed             = def{"kvgate_kv_used_bytes", "KV bytes a GPU's backends report in use (vllm:kv_cache_usage_perc × their pool); 0 until they have reported.", []string{"gpu"}}.desc()
	descBound            = def{"kvgate_kv_bound_requests", "Requests bound to a GPU (admitted, not yet released).", []string{"gpu"}}.desc()
	descGated            = def{"kvgate_kv_headroom_gate", "1 while a GPU's backends report more than (1 − headroom) × its budget in use, so nothing new is admitted to it.", []string{"gpu"}}.desc()
	descDrain            = def{"kvgate_kv_drain_rate_bytes_per_second", "Measured release rate per busy second behind Retry-After.", []string{"gpu"}}.desc()
	descQueued           = def{"kvgate_kv_queued_bytes", "Worst-case KV bytes of the requests waiting for a model.", []string{"model"}}.desc()
	descDepth            = def{"kvgate_queue_depth", "Requests waiting for admission, per model and class.", []string{"model", "class"}}.desc()
	descClassHeld        = def{"kvgate_class_kv_held_bytes", "Worst case of the requests a model's class has admitted and not released.", []string{"model", "class"}}.desc()
	descPredicting       = def{"kvgate_admission_predicting", "1 when a model's requests are admitted by their predicted growth (past the warm-up), 0 while held at their worst case.", []string{"model"}}.desc()
	descSamples          = def{"kvgate_admission_length_samples", "Finished sequences a model's output-length predictor rests on (decayed).", []string{"model"}}.desc()
	descResumableEpsilon = def{"kvgate_admission_resumable_epsilon", "The same bound for a stream the guard can stop and resume, under the predicted policy (0 under worst_case and count).", nil}.desc()
	descEpsilon          = def{"kvgate_admission_epsilon", "The bound on the probability that a GPU's real KV use passes its budget, per admission, under the predicted policy (0 under worst_case and count).", nil}.desc()
	descTenantHeld       = def{"kvgate_tenant_kv_held_bytes", "What a tenant's admitted requests hold, every GPU together (tenant \"\" is anonymous).", []string{"tenant"}}.desc()
	descTenantQ          = def{"kvgate_tenant_queue_depth", "A tenant's requests waiting for admission.", []string{"tenant"}}.desc()
	descUp               = def{"kvgate_backend_up", "1 if requests are routed to the backend (circuit closed or half-open), else 0.", []string{"backend"}}.desc()
	descState            = def{"kvgate_backend_state", "The backend's circuit: one series per state (closed, half-open, open), the current one 1, the others 0.", []string{"backend", "state"}}.desc()
	descScraped          = def{"kvgate_backend_last_report_timestamp_seconds", "Unix time of the backend's last /metrics report the gateway read; 0 before the first.", []string{"backend"}}.desc()
	descUsage            = def{"kvgate_backend_kv_usage_ratio", "KV cache usage the backend reports (vllm:kv_cache_usage_perc), 0–1; 0 before its first report.", []string{"backend"}}.desc()
	descRunning          = def{"kvgate_backend_requests_running", "Requests the backend reports running.", []string{"backend"}}.desc()
	descWaiting          = def{"kvgate_backend_requests_waiting", "Requests the backend reports waiting.", []string{"backend"}}.desc()
	descPreempt          = def{"kvgate_backend_preemptions_total", "Preemptions the backend reports (its vllm:num_preemptions_total, so it resets when the backend restarts).", []string{"backend"}}.desc()
	descTokLookups       = def{"kvgate_tokenize_cache_lookups_total", "Prompts looked up in a model's cache of /tokenize answers, by result: hit (counted without a round trip) or miss (the backend was asked).", []string{"model", "result"}}.desc()
	descTokStale         = def{"kvgate_tokenize_cache_stale_total", "Cached prompt counts dropped because the backend's usage reported another length (its tokenizer changed).", []string{"model"}}.desc()
	descTokEntries       = def{"kvgate_tokenize_cache_entries", "Prompt counts a model's tokenize cache holds.", []string{"model"}}.desc()
	descRunningKV        = def{"kvgate_kv_running_bytes", "What the requests bound to a GPU may hold on it now: prompt and tokens generated plus a block of lead for streams, the worst case for the rest (the guard's account, kept within the budget).", []string{"gpu"}}.desc()
	descStops            = def{"kvgate_admission_guard_stops_total", "Running streams the admission guard stopped to keep a GPU within its KV budget when they outgrew their forecast.", nil}.desc()
	descTrips            = def{"kvgate_admission_forecast_trips_total", "Times a forecast was distrusted (its requests back on worst-case admission for admission.cool_down, its learning started over), by reason: drift (sequences outgrew their forecast by more than the guard's room allows: a model's, a tenant's or a class's), guard (a stream had to be stopped), overflow (a backend ran out of KV memory or preempted).", []string{"reason"}}.desc()
	descDrift            = def{"kvgate_admission_drift_trips_total", "The change detector's trips by what was distrusted: queue (a model's anonymous traffic of one class: the whole model), tenant (one tenant of a model), class (one class of a model).", []string{"scope"}}.desc()
	descShared           = def{"kvgate_kv_shared_bytes", "Prompt blocks a GPU counts once for the requests that share them (its backends hold them once, with prefix caching); part of kvgate_kv_held_bytes.", []string{"gpu"}}.desc()
	descSaved            = def{"kvgate_kv_shared_saved_bytes", "What counting a GPU's shared prompt blocks once per request would have added to kvgate_kv_held_bytes.", []string{"gpu"}}.desc()
	descPromptBlk        = def{"kvgate_prompt_blocks_total", "Prompt blocks that could be shared, of the requests admitted to a GPU while it shares (prefix caching).", []string{"gpu"}}.desc()
	descSharedBlk        = def{"kvgate_prompt_blocks_shared_total", "Of kvgate_prompt_blocks_total, those found held already by a running request at admission, so counted once.", []string{"gpu"}}.desc()
	descEstCal           = def{"kvgate_prompt_estimate_calibrated", "1 while a model's prompt estimate is calibrated (tighter than the byte bound), 0 while it is the bound.", []string{"model"}}.desc()
	descEstRatio         = def{"kvgate_prompt_estimate_ratio", "The calibrated prompt estimate's tokens per piece of text: the slope of the line that lies above every recent answer's real count (0 before any).", []string{"model"}}.desc()
	descEstOver          = def{"kvgate_prompt_estimate_overhead_tokens", "The calibrated prompt estimate's tokens a prompt beside its text: the intercept of that line (the chat template's overhead, learnt).", []string{"model"}}.desc()
	descEstSamples       = def{"kvgate_prompt_estimate_samples", "Answers the prompt estimate's calibration window holds.", []string{"model"}}.desc()
	descEstWidened       = def{"kvgate_prompt_estimate_widened_total", "Answers whose usage.prompt_tokens passed what the prompt estimate would have said for them: each sends the estimate back to the byte bound until calibration is earned again.", []string{"model"}}.desc()
	descUnacc            = def{"kvgate_kv_unaccounted_bytes", "KV memory a GPU's backends hold that no request admitted there accounts for (another client of the backend, or a count gone wrong), sustained beyond admission.reconcile's tolerance; it comes off what the GPU admits while it lasts.", []string{"gpu"}}.desc()
	descUnaccObs         = def{"kvgate_kv_unaccounted_observed_bytes", "The last report's KV use of a GPU's backends less what the requests admitted there may hold (0 if negative), before the tolerance and the sustain window.", []string{"gpu"}}.desc()
	descDistrust         = def{"kvgate_admission_distrusted", "1 while a model's forecast is distrusted (cool-down: its requests are held at their worst case).", []string{"model"}}.desc()
)

// stateCollector reads the scheduler and the backends at scrape time.
type stateCollector struct{ current func() *runtime }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCapacity, descEffective, descHeld, descCommitted, descUsed, descBound, descGated,
		descDrain, descQueued, descDepth, descClassHeld, descPredicting, descSamples, descEpsilon, descResumableEpsilon, descTenantHeld, descTenantQ,
		descUp, descState, descScraped, descUsage, descRunning, descWaiting, descPreempt,
		descTokLookups, descTokStale, descTokEntries, descRunningKV, descStops, descTrips, descDrift, descDistrust,
		descShared, descSaved, descPromptBlk, descSharedBlk, descEstCal, descEstRatio, descEstOver, descEstSamples, descEstWidened, descUnacc, descUnaccObs} {
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
	gpuOf := map[string]string{} // id → GPU name (they differ after a rename)
	for name, g := range rt.gpus {
		gpuOf[g.id] = name
	}
	for _, p := range st.GPUs {
		gpu, ok := gpuOf[p.Name]
		if !ok {
			continue // a pool no GPU of this configuration uses any more
		}
		gauge(descCapacity, float64(p.Capacity), gpu)
		rv, _ := rt.reconciled.view(p.Name) // zero until the backends have reported
		gauge(descUnacc, float64(rv.Unaccounted), gpu)
		gauge(descUnaccObs, float64(rv.Observed), gpu)
		gauge(descEffective, float64(p.Effective), gpu)
		gauge(descHeld, float64(p.Held), gpu)
		gauge(descCommitted, float64(p.Committed), gpu)
		gauge(descUsed, float64(p.Used), gpu) // 0 until reported (p.UsedKnown)
		gauge(descBound, float64(p.Tickets), gpu)
		gauge(descGated, boolFloat(p.Gated), gpu)
		gauge(descDrain, p.DrainRate, gpu)
		gauge(descRunningKV, float64(p.Now), gpu)
		gauge(descShared, float64(p.Shared), gpu)
		gauge(descSaved, float64(p.SharedSaved), gpu)
		ch <- prometheus.MustNewConstMetric(descPromptBlk, prometheus.CounterValue, float64(p.PromptBlocks), gpu)
		ch <- prometheus.MustNewConstMetric(descSharedBlk, prometheus.CounterValue, float64(p.SharedBlocks), gpu)
	}
	ch <- prometheus.MustNewConstMetric(descStops, prometheus.CounterValue, float64(st.GuardStops))
	for reason, n := range st.Trips {
		ch <- prometheus.MustNewConstMetric(descTrips, prometheus.CounterValue, float64(n), reason)
	}
	for scope, n := range st.DriftTrips {
		ch <- prometheus.MustNewConstMetric(descDrift, prometheus.CounterValue, float64(n), scope)
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
	eps, reps := 0.0, 0.0
	if a := rt.cfg.Admission; a.Mode == modeKV && a.Reservation == admission.Predicted {
		eps, reps = a.epsilon(), a.resumableEpsilon()
	}
	gauge(descEpsilon, eps)
	gauge(descResumableEpsilon, reps)
	for _, t := range st.Tenants {
		gauge(descTenantHeld, float64(t.Held), t.Name)
		gauge(descTenantQ, float64(t.Queued), t.Name)
	}
	for _, b := range rt.upstreams.Backends() {
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
		es := rt.models[name].est.state()
		gauge(descEstCal, boolFloat(es.Calibrated), name)
		gauge(descEstRatio, es.Ratio, name)
		gauge(descEstOver, es.Overhead, name)
		gauge(descEstSamples, float64(es.Samples), name)
		ch <- prometheus.MustNewConstMetric(descEstWidened, prometheus.CounterValue, float64(es.Widened), name)
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
