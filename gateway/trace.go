package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Tracing (tracing.otlp_endpoint): a server span per proxied request,
// named after its route and parented by the client's traceparent when it
// sent one, with a child for each part of its life that takes time:
//
//	admission.queue  waiting for room on a GPU (only when it waited)
//	upstream         from sending to a backend until its answer, or its
//	                 first event for a stream (one per backend tried)
//	stream           relaying a streamed answer, from its first event to
//	                 its end
//
// The backend is sent the upstream span's traceparent, so that a vLLM that
// exports spans of its own nests them under the attempt that reached it.
// Spans are batched and exported over OTLP/HTTP by the OpenTelemetry SDK;
// their timestamps come from the gateway's clock (Options.Clock), like
// every latency it measures. The attributes are the access log's (never a
// key or a prompt), read from the exchange at its finish.
//
// With tracing off, a request costs an atomic load and nothing else: the
// exchange's trace is nil, and the client's own trace headers reach the
// backend unchanged (forwardedHeaders).
//
// A reload that changes the section builds a new exporter for the requests
// that arrive after it; the old one is shut down — its last spans flushed —
// once the requests that began under it have finished (tracer.users).

// tracerFlushTimeout bounds a tracer's last export, at a reload or at
// shutdown: a collector that does not answer must not hold the gateway.
const tracerFlushTimeout = 5 * time.Second

// traceContext reads and writes W3C traceparent and tracestate.
var traceContext propagation.TraceContext

// tracing is the server's current tracer and those a reload retired whose
// last requests have not finished.
type tracing struct {
	cur atomic.Pointer[tracer] // nil: tracing off

	mu   sync.Mutex // guards live
	live map[*tracer]bool
}

// tracer is one generation of span export, built from a tracing section.
type tracer struct {
	cfg TracingConfig
	tp  *sdktrace.TracerProvider
	t   trace.Tracer
	log *slog.Logger
	// users counts the requests holding the tracer; once it is retired the
	// last of them shuts it down. Each side writes its own atomic before it
	// reads the other's, so one of them sees both and shuts it down.
	users   atomic.Int64
	retired atomic.Bool
	once    sync.Once
	onDone  func()
}

// apply makes cfg the tracing in force, unless it is already; the tracer
// it replaces is retired. The callers (New, Reload) are serialised.
func (tr *tracing) apply(cfg TracingConfig, log *slog.Logger) error {
	old := tr.cur.Load()
	if old == nil && !cfg.on() || old != nil && old.cfg.sameAs(cfg) {
		return nil
	}
	var t *tracer
	if cfg.on() {
		var err error
		if t, err = newTracer(cfg, log); err != nil {
			return err
		}
		tr.mu.Lock()
		if tr.live == nil {
			tr.live = map[*tracer]bool{}
		}
		tr.live[t] = true
		tr.mu.Unlock()
		t.onDone = func() {
			tr.mu.Lock()
			delete(tr.live, t)
			tr.mu.Unlock()
		}
	}
	tr.cur.Store(t)
	switch {
	case t != nil:
		// The URL only: the headers may hold credentials.
		log.Info("tracing: exporting spans", "endpoint", cfg.endpointURL(), "service_name", cfg.ServiceName, "sample_ratio", cfg.sampleRatio())
	default:
		log.Info("tracing: off")
	}
	if old != nil {
		old.retire()
	}
	return nil
}

// close turns tracing off and shuts down every tracer, flushing the spans
// that have ended, at most tracerFlushTimeout. Requests still in flight
// lose theirs: the gateway is on its way out.
func (tr *tracing) close() {
	tr.cur.Store(nil)
	tr.mu.Lock()
	var all []*tracer
	for t := range tr.live {
		all = append(all, t)
	}
	tr.mu.Unlock()
	for _, t := range all {
		t.shutdown()
	}
}

func newTracer(cfg TracingConfig, log *slog.Logger) (*tracer, error) {
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(cfg.endpointURL())}
	if len(cfg.Headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(cfg.Headers))
	}
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: exporter for %s: %w", cfg.endpointURL(), err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", cfg.ServiceName)))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(&loggedExporter{SpanExporter: exp, log: log, endpoint: cfg.endpointURL()}),
		// A client's sampled flag decides for its whole trace; the ratio
		// only for the traces that begin here.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.sampleRatio()))),
		sdktrace.WithResource(res),
	)
	return &tracer{cfg: cfg, tp: tp, t: tp.Tracer("github.com/kvgate/kvgate/gateway"), log: log}, nil
}

func (t *tracer) release() {
	if t.users.Add(-1) == 0 && t.retired.Load() {
		go t.shutdown()
	}
}

func (t *tracer) retire() {
	t.retired.Store(true)
	if t.users.Load() == 0 {
		go t.shutdown()
	}
}

// shutdown flushes the spans that have ended and stops the exporter; a
// second call waits for the first.
func (t *tracer) shutdown() {
	t.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracerFlushTimeout)
		defer cancel()
		if err := t.tp.Shutdown(ctx); err != nil {
			t.log.Warn("tracing: the last spans could not be exported", "endpoint", t.cfg.endpointURL(), "err", err)
		}
		if t.onDone != nil {
			t.onDone()
		}
	})
}

// loggedExporter logs a collector's failures once per change, not once per
// batch; the SDK would hand them to OpenTelemetry's global error handler.
type loggedExporter struct {
	sdktrace.SpanExporter
	log      *slog.Logger
	endpoint string
	failing  atomic.Bool
}

func (e *loggedExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	switch {
	case err != nil && !e.failing.Swap(true):
		e.log.Warn("tracing: the collector did not take spans; dropping them until it does", "endpoint", e.endpoint, "err", err)
	case err == nil && e.failing.Swap(false):
		e.log.Info("tracing: the collector takes spans again", "endpoint", e.endpoint)
	}
	return nil // logged: the batch is dropped either way
}

// headerCarrier lets the propagator read and write fasthttp's headers.
type headerCarrier struct{ h header }

// header is fasthttp's RequestHeader, as the carrier uses it.
type header interface {
	Peek(key string) []byte
	Set(key, value string)
}

func (c headerCarrier) Get(k string) string { return string(c.h.Peek(k)) }
func (c headerCarrier) Set(k, v string)     { c.h.Set(k, v) }
func (c headerCarrier) Keys() []string      { return traceContext.Fields() }

var _ propagation.TextMapCarrier = headerCarrier{}
