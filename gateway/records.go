package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/accesslog"
)

// A request's records, what it leaves for the operator to read (the
// gateway decides nothing by them): its access line, its span (trace.go
// holds the exporter and names the spans) and its model's and tenant's
// series (metrics.go defines them). Each step writes its part as the
// request reaches it, and finish closes them.

// records are what is written of a request: its access line and its
// spans.
type records struct {
	access accessRecord
	trace  *reqTrace // nil with tracing off
}

// The access log: one line per proxied request, written by its finish, so
// that every way a request leaves (answered, refused, shed, failed,
// cancelled) gives exactly one line. It goes through the gateway's logger
// (log.format: text or json) at info, with the message "request".
//
// It says who asked (request id, tenant), for what (route, model), where it
// ran (GPU, backend), how it ended (status, outcome, refusal reason), how
// long each part took (queue wait, time to first token, total), and what it
// cost (prompt and output tokens, KV bytes reserved). It never holds an API
// key, a prompt or an answer: only what the gateway decided and measured,
// and the client's X-Request-Id, for correlation with the client's logs.

// noteAccess keeps what the access line needs of the request itself, which
// is gone (or not the handler's to read) when a stream finishes. Nothing
// is kept with the access log off; with it on, the client's strings are
// copied into one pooled buffer, given back when the line is written.
func (x *exchange) noteAccess(ctx *fasthttp.RequestCtx, route string) {
	if !*x.rt.cfg.Log.Access {
		return
	}
	a := &x.access
	a.on, a.rc, a.route = true, ctx, route
	h := &ctx.Request.Header
	a.method = methodName(ctx.Method())
	a.bytesIn = len(ctx.Request.Body())
	a.traceID = traceparentID(h.Peek("Traceparent"))
	raw := accessBufs.Get().(*[]byte)
	b := (*raw)[:0]
	b = append(b, h.Peek(headerRequestID)...) // made sane by stampRequestID
	ends := [4]int{len(b)}
	b = accesslog.AppendAddr(b, ctx.RemoteAddr())
	ends[1] = len(b)
	b = append(b, clip(h.Peek("X-Forwarded-For"))...)
	ends[2] = len(b)
	b = append(b, clip(h.UserAgent())...)
	ends[3] = len(b)
	*raw, a.raw = b, raw
	// Views into b, which is not written again until the line is.
	a.id = viewString(b[:ends[0]])
	a.client = viewString(b[ends[0]:ends[1]])
	a.forwardedFor = viewString(b[ends[1]:ends[2]])
	a.userAgent = viewString(b[ends[2]:ends[3]])
}

// accessBufs hold the client's strings of access records (noteAccess).
var accessBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// viewString is b as a string without a copy; b must not change while the
// string is in use.
func viewString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// accessRecord is an exchange's part of its access line.
type accessRecord struct {
	on            bool
	method, route string
	id, client    string // views into raw
	forwardedFor  string // view into raw
	userAgent     string // view into raw
	traceID       string // the client's trace, until the gateway's span has one
	bytesIn       int
	// raw holds the client's strings above, from accessBufs.
	raw *[]byte
	// rc is read for the status of an answer the handler wrote: finish
	// runs on the handler's goroutine then. A stream's status is its 200.
	rc     *fasthttp.RequestCtx
	ttft   time.Duration // 0 until the first token
	waited time.Duration // in the queue, for a request refused after waiting
	// sent counts a stream's bytes as the relay flushes them; nil for an
	// answer the handler wrote.
	sent *countWriter
	// attempts counts the sends to a backend (a failover's and a resumed
	// stream's included); sentAt is when the last began.
	attempts int
	sentAt   time.Time
}

// maxLoggedHeader bounds a header the access line copies from the client.
const maxLoggedHeader = 256

func clipped(v []byte) string { return string(clip(v)) }

// clip is v cut to maxLoggedHeader bytes.
func clip(v []byte) []byte { return v[:min(len(v), maxLoggedHeader)] }

// methodName is the request's method without a copy for the usual ones.
func methodName(m []byte) string {
	switch string(m) {
	case fasthttp.MethodPost:
		return fasthttp.MethodPost
	case fasthttp.MethodGet:
		return fasthttp.MethodGet
	case fasthttp.MethodDelete:
		return fasthttp.MethodDelete
	}
	return clipped(m)
}

// traceparentID is the trace id of a W3C traceparent
// (00-<32 hex trace id>-<16 hex span id>-<flags>); "" if it is not one.
func traceparentID(tp []byte) string {
	if len(tp) < 55 || tp[2] != '-' || tp[35] != '-' {
		return ""
	}
	for _, c := range tp[3:35] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return ""
		}
	}
	return string(tp[3:35])
}

// logAccess writes the request's access line; finish calls it once.
func (x *exchange) logAccess(outcome, reason string, total time.Duration) {
	a := &x.access
	if !a.on {
		return
	}
	defer a.release()
	if !x.s.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	prompt, output := x.tokens()
	l := accesslog.Line{
		ID: a.id, Method: a.method, Route: a.route, Client: a.client, ForwardedFor: a.forwardedFor, UserAgent: a.userAgent,
		Tenant: x.tenant, Model: x.label, GPU: x.gpuName(), Backend: x.backendName(),
		Retries: max(x.access.attempts-1, 0), Status: x.answerStatus(a.rc, outcome), Outcome: outcome, Reason: reason,
		QueueWaitMS: accesslog.Millis(x.queueWait()), TTFTMS: accesslog.Millis(a.ttft), DurationMS: accesslog.Millis(total),
		BytesIn: a.bytesIn, BytesOut: x.bytesOut(a.rc), PromptTokens: prompt, OutputTokens: output,
		KVReservedBytes: x.res.weight(), TraceID: a.traceID,
	}
	if x.backend != nil {
		l.UpstreamAddr = x.backend.Addr()
		l.UpstreamMS = accesslog.Millis(x.start.Add(total).Sub(x.access.sentAt)) // to the same end as duration_ms
	}
	if x.trace != nil {
		l.TraceID = x.trace.span.SpanContext().TraceID().String()
	}
	if w := x.s.access; w != nil {
		w.Add(x.s.now(), &l)
		return
	}
	x.s.log.LogAttrs(context.Background(), slog.LevelInfo, accesslog.Msg, l.Attrs()...)
}

// release gives the record's buffer back; its views end with it.
func (a *accessRecord) release() {
	if a.raw != nil {
		accessBufs.Put(a.raw)
		a.raw, a.id, a.client, a.forwardedFor, a.userAgent = nil, "", "", "", ""
	}
}

// bytesOut is the answer's body bytes written so far: a stream's as the
// relay flushed them, else the body the handler wrote.
func (x *exchange) bytesOut(rc *fasthttp.RequestCtx) int64 {
	switch {
	case x.access.sent != nil:
		return x.access.sent.n
	case x.body.x != nil || rc == nil:
		return 0 // a stream not written (yet), or never begun
	}
	return int64(len(rc.Response.Body()))
}

// answerStatus is the status the client got; rc is read only for an answer
// the handler wrote (nil: unknown, taken as 200).
func (x *exchange) answerStatus(rc *fasthttp.RequestCtx, outcome string) int {
	switch {
	case x.body.x != nil: // a stream: its 200 went out with the first event
	case rc != nil && outcome == outcomeCanceled && len(rc.Response.Body()) == 0:
		return 499 // nothing was answered: the client left (nginx's code for it)
	case rc != nil:
		return rc.Response.StatusCode()
	}
	return 200
}

// queueWait is how long the request waited for admission, admitted or not.
func (x *exchange) queueWait() time.Duration {
	if x.ticket != nil {
		return x.ticket.Waited()
	}
	return x.access.waited
}

// gpuName is the name of the GPU the request was admitted to; "" if none.
func (x *exchange) gpuName() string {
	if x.ticket == nil {
		return ""
	}
	gpu := x.ticket.GPU()
	if g := x.rt.gpuByID[gpu]; g != nil {
		return g.name
	}
	return gpu
}

// backendName is the backend the request was sent to last; "" if none.
func (x *exchange) backendName() string {
	if x.backend == nil {
		return ""
	}
	return x.backend.Name()
}

// tokens are the request's prompt and output tokens: the backend's usage
// when it reported it, else the prompt as counted and no output.
func (x *exchange) tokens() (prompt, output int) {
	if x.hasUsage {
		return x.usage.prompt, x.usage.completion
	}
	return x.predicted, 0
}

// The request's span, with tracing on: one server span and its children
// (trace.go), nil with tracing off, which costs the request an atomic
// load (acquire) and a nil check at each step.

// acquire is the current tracer, held for one request until its release;
// nil with tracing off.
func (tr *tracing) acquire() *tracer {
	for {
		t := tr.cur.Load()
		if t == nil {
			return nil
		}
		t.users.Add(1)
		if tr.cur.Load() == t {
			return t
		}
		t.release() // retired meanwhile: take its successor
	}
}

// reqTrace is one request's spans; nil with tracing off, and every method
// does nothing on a nil one.
type reqTrace struct {
	t    *tracer
	ctx  context.Context // holds span
	span trace.Span
	// rc is read for the status of an answer the handler wrote, as the
	// access log's is.
	rc *fasthttp.RequestCtx
	// attempt is the upstream span of the backend waited on; nil once
	// it answered.
	attempt    trace.Span
	admittedAt time.Time // when admission answered, after waiting or not
	answeredAt time.Time // when the backend's answer (a stream's first event) came
}

// startTrace begins the request's span, at its arrival.
func (x *exchange) startTrace(ctx *fasthttp.RequestCtx, kind endpoint) {
	t := x.s.tracing.acquire()
	if t == nil {
		return
	}
	parent := traceContext.Extract(context.Background(), headerCarrier{&ctx.Request.Header})
	c, span := t.t.Start(parent, spanNames[kind], trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(x.start),
		trace.WithAttributes(attribute.String("http.request.method", fasthttp.MethodPost), attribute.String("http.route", kind.path()),
			// As OpenTelemetry names a captured request header.
			attribute.StringSlice("http.request.header.x-request-id", []string{string(ctx.Request.Header.Peek(headerRequestID))})))
	x.trace = &reqTrace{t: t, ctx: c, span: span, rc: ctx}
}

// admitted marks admission's answer, the queue span's end.
func (r *reqTrace) admitted(x *exchange) {
	if r == nil {
		return
	}
	r.admittedAt = x.s.now()
}

// upstream begins an attempt's span, and gives the backend its
// traceparent. An attempt before it got no answer.
func (r *reqTrace) upstream(x *exchange, ureq *fasthttp.Request, be *backends.Backend) {
	if r == nil {
		return
	}
	now := x.s.now()
	if r.attempt != nil {
		r.attempt.SetStatus(codes.Error, "no answer: tried another backend")
		r.attempt.End(trace.WithTimestamp(now))
	}
	c, span := r.t.t.Start(r.ctx, "upstream", trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(now),
		trace.WithAttributes(attribute.String("kvgate.backend", be.Name())))
	r.attempt = span
	traceContext.Inject(c, headerCarrier{&ureq.Header})
}

// answered ends the upstream span: the backend answers.
func (r *reqTrace) answered(x *exchange) {
	if r == nil || r.attempt == nil {
		return
	}
	r.answeredAt = x.s.now()
	r.attempt.End(trace.WithTimestamp(r.answeredAt))
	r.attempt = nil
}

// end ends the request's spans at its finish (took after its arrival),
// with the access log's account of it, and lets the tracer go.
func (r *reqTrace) end(x *exchange, outcome, reason string, took time.Duration) {
	if r == nil {
		return
	}
	defer r.t.release()
	end := x.start.Add(took)
	at := trace.WithTimestamp(end)
	why := outcome
	if reason != "" {
		why += ": " + reason
	}
	if r.attempt != nil {
		r.attempt.SetStatus(codes.Error, why)
		r.attempt.End(at)
		r.attempt = nil
	}
	if !r.span.IsRecording() {
		return // not sampled: only its context was needed, for the backend
	}
	waited := x.queueWait()
	if waited > 0 && !r.admittedAt.IsZero() {
		_, q := r.t.t.Start(r.ctx, "admission.queue", trace.WithTimestamp(r.admittedAt.Add(-waited)),
			trace.WithAttributes(attribute.String("kvgate.class", x.class), attribute.Bool("kvgate.admitted", x.ticket != nil)))
		q.End(trace.WithTimestamp(r.admittedAt))
	}
	if x.body.x != nil && !r.answeredAt.IsZero() {
		_, st := r.t.t.Start(r.ctx, "stream", trace.WithTimestamp(r.answeredAt))
		if outcome != outcomeOK {
			st.SetStatus(codes.Error, why)
		}
		st.End(at)
	}
	status := x.answerStatus(r.rc, outcome)
	prompt, output := x.tokens()
	r.span.SetAttributes(
		attribute.Int("http.response.status_code", status),
		attribute.String("gen_ai.request.model", x.label),
		attribute.Int("gen_ai.usage.input_tokens", prompt),
		attribute.Int("gen_ai.usage.output_tokens", output),
		attribute.String("kvgate.tenant", x.tenant),
		attribute.String("kvgate.class", x.class),
		attribute.String("kvgate.gpu", x.gpuName()),
		attribute.String("kvgate.backend", x.backendName()),
		attribute.String("kvgate.outcome", outcome),
		attribute.String("kvgate.reason", reason),
		attribute.Int64("kvgate.kv_reserved_bytes", x.res.weight()),
		attribute.Float64("kvgate.queue_wait_ms", accesslog.Millis(waited)),
	)
	// As for any server span, a 4xx (a refusal, a shed) is the client's
	// to handle, not an error of the gateway's.
	if outcome == outcomeFailed || status >= 500 {
		r.span.SetStatus(codes.Error, why)
	}
	r.span.End(at)
}

// The series a request updates: its model's and its tenant's, looked up
// once per name and kept, and admission's events as they happen.

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

// observer feeds the scheduler's admissions into the metrics. Labels name
// the GPU as the configuration does (a budget keeps its first GPU's name
// across a rename, see gpu.id).
type observer struct{ m *metrics }

func (o observer) gpu(id string) string {
	if rt := o.m.current(); rt != nil {
		if g := rt.gpuByID[id]; g != nil {
			return g.name
		}
	}
	return id
}

func (o observer) Admitted(e admission.Event) {
	queued := "false"
	if e.Waited > 0 {
		queued = "true"
		o.m.queueWait.WithLabelValues(e.Queue, e.Class, "admitted").Observe(e.Waited.Seconds())
	}
	gpu := o.gpu(e.GPU)
	o.m.admissions.WithLabelValues(gpu, e.Class, e.Tenant, queued).Inc()
	if e.Backfilled {
		o.m.backfilled.WithLabelValues(e.Queue, gpu).Inc()
	}
	if e.Preemptive {
		o.m.preemptive.WithLabelValues(e.Queue, gpu).Inc()
	}
}

func (o observer) Rejected(e admission.Event, reason string) {
	if e.Waited > 0 {
		o.m.queueWait.WithLabelValues(e.Queue, e.Class, reason).Observe(e.Waited.Seconds())
	}
	o.m.admissionRejects.WithLabelValues(e.Queue, e.Class, e.Tenant, reason).Inc()
}
