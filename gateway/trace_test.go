package gateway

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

// otlpReceiver is an OTLP/HTTP collector: it decodes what the gateway
// exports and keeps every span with its service.name.
type otlpReceiver struct {
	url string

	mu      sync.Mutex // guards the fields below
	spans   []*tracepb.Span
	service map[*tracepb.Span]string
	auth    []string // each export's Authorization header
}

func startReceiver(t testing.TB) *otlpReceiver {
	t.Helper()
	rcv := &otlpReceiver{service: map[*tracepb.Span]string{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("export to %s as %q", r.URL.Path, r.Header.Get("Content-Type"))
			http.NotFound(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if err != nil {
			t.Errorf("decode an export: %v", err)
			http.Error(w, err.Error(), 400)
			return
		}
		rcv.mu.Lock()
		rcv.auth = append(rcv.auth, r.Header.Get("Authorization"))
		for _, rs := range req.ResourceSpans {
			svc := attrOf(rs.GetResource().GetAttributes(), "service.name").GetStringValue()
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					rcv.spans = append(rcv.spans, sp)
					rcv.service[sp] = svc
				}
			}
		}
		rcv.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	rcv.url = srv.URL
	return rcv
}

func (rcv *otlpReceiver) all() []*tracepb.Span {
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	return append([]*tracepb.Span(nil), rcv.spans...)
}

// flushUntil flushes the gateway's spans until the receiver has n: a
// stream's spans end just after the client has its last byte.
func (rcv *otlpReceiver) flushUntil(t testing.TB, gw *Server, n int) []*tracepb.Span {
	t.Helper()
	eventually(t, "the spans", func() bool {
		if tr := gw.tracing.cur.Load(); tr != nil {
			if err := tr.tp.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		return len(rcv.all()) >= n
	})
	return rcv.all()
}

func attrOf(attrs []*commonpb.KeyValue, key string) *commonpb.AnyValue {
	for _, kv := range attrs {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

func spanNamed(t testing.TB, spans []*tracepb.Span, name string) *tracepb.Span {
	t.Helper()
	for _, sp := range spans {
		if sp.Name == name {
			return sp
		}
	}
	t.Fatalf("no span %q among %v", name, spanList(spans))
	return nil
}

func spanList(spans []*tracepb.Span) []string {
	var s []string
	for _, sp := range spans {
		s = append(s, sp.Name)
	}
	return s
}

func took(sp *tracepb.Span) time.Duration {
	return time.Duration(sp.EndTimeUnixNano - sp.StartTimeUnixNano)
}

// recordingBackend stands in front of the simulator and keeps the headers
// of each completion request that reaches it; arrive runs as one arrives,
// done as a stream's [DONE] goes by, before either reaches the gateway.
type recordingBackend struct {
	url string

	mu     sync.Mutex
	got    []http.Header
	arrive func(*http.Request)
	done   func()
}

func startRecording(t testing.TB, simURL string) *recordingBackend {
	t.Helper()
	target, err := url.Parse(simURL)
	if err != nil {
		t.Fatal(err)
	}
	rb := &recordingBackend{}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	rp.ModifyResponse = func(resp *http.Response) error {
		rb.mu.Lock()
		done := rb.done
		rb.mu.Unlock()
		if done != nil && strings.HasSuffix(resp.Request.URL.Path, "/completions") {
			resp.Body = &onDone{ReadCloser: resp.Body, f: done}
		}
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/completions") {
			rb.mu.Lock()
			rb.got = append(rb.got, r.Header.Clone())
			arrive := rb.arrive
			rb.mu.Unlock()
			if arrive != nil {
				arrive(r)
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	rb.url = srv.URL
	return rb
}

// hook sets arrive and done, while the gateway's probes may be calling.
func (rb *recordingBackend) hook(arrive func(*http.Request), done func()) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	rb.arrive, rb.done = arrive, done
}

func (rb *recordingBackend) headers() []http.Header {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	return append([]http.Header(nil), rb.got...)
}

// onDone calls f once, before the stream's [DONE] is read: the events
// before it are read first, on their own.
type onDone struct {
	io.ReadCloser
	f     func()
	fired bool
	rest  []byte // [DONE] and what follows it, read but not yet returned
}

func (d *onDone) Read(p []byte) (int, error) {
	if len(d.rest) > 0 {
		d.fire()
		n := copy(p, d.rest)
		d.rest = d.rest[n:]
		return n, nil
	}
	n, err := d.ReadCloser.Read(p)
	if i := bytes.Index(p[:n], []byte("data: [DONE]")); i >= 0 && !d.fired {
		if i == 0 {
			d.fire()
			return n, err
		}
		d.rest = append([]byte(nil), p[i:n]...)
		return i, nil
	}
	return n, err
}

func (d *onDone) fire() {
	if !d.fired {
		d.fired = true
		d.f()
	}
}

// traceparent is a W3C traceparent's parts.
type traceparent struct{ traceID, spanID, flags string }

func parseTraceparent(t testing.TB, s string) traceparent {
	t.Helper()
	p := strings.Split(s, "-")
	if len(p) != 4 || p[0] != "00" || len(p[1]) != 32 || len(p[2]) != 16 {
		t.Fatalf("traceparent %q", s)
	}
	return traceparent{p[1], p[2], p[3]}
}

func tracingYAML(endpoint, more string) string {
	return "tracing:\n  otlp_endpoint: " + endpoint + "\n" + more
}

// A request's spans reach the collector: the request's, continuing the
// client's trace, with the access log's attributes; a child for the
// backend's answer, whose context the backend is sent; a child for the
// stream. Their times are the gateway's clock's, to the nanosecond.
func TestTracingSpans(t *testing.T) {
	_, simURL := startSim(t, nil)
	const clientTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	cases := []struct {
		name   string
		path   string
		body   string
		header []string // the client's
		// the spans' names, the request's first, and how long each took
		spans []string
		took  []time.Duration
	}{
		{"answered, in the client's trace", "/v1/chat/completions", chatBody("hello there", 5, false),
			[]string{"Traceparent", clientTP, "Tracestate", "vendor=x", "Authorization", "Bearer key-acme"},
			[]string{"POST /v1/chat/completions", "upstream"}, []time.Duration{300 * time.Millisecond, 300 * time.Millisecond}},
		{"streamed, a trace of its own", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":4,"stream":true}`,
			[]string{"Authorization", "Bearer key-acme"},
			[]string{"POST /v1/completions", "upstream", "stream"}, []time.Duration{500 * time.Millisecond, 300 * time.Millisecond, 200 * time.Millisecond}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rcv := startReceiver(t)
			rb := startRecording(t, simURL)
			clock := newClock()
			extra := "tenants: [{name: acme, api_keys: [key-acme]}]\n" + tracingYAML(rcv.url, "  service_name: gw-test\n")
			gw, gwURL := startGateway(t, baseConfig(rb.url, extra), Options{Clock: clock})
			// The backend takes 300ms to answer, and a stream 200ms more
			// once its first event has reached the gateway.
			rb.hook(func(*http.Request) { clock.Advance(300 * time.Millisecond) }, func() {
				eventually(t, "the stream to begin", func() bool {
					streaming := false
					gw.flights.each(func(x *exchange) { streaming = streaming || x.stage.Load() == stageStreaming })
					return streaming
				})
				clock.Advance(200 * time.Millisecond)
			})
			r := postJSON(gwURL, c.path, c.body, c.header...)
			if r.err != nil || r.status != 200 {
				t.Fatalf("%d %v %s", r.status, r.err, r.body)
			}
			spans := rcv.flushUntil(t, gw, len(c.spans))
			if len(spans) != len(c.spans) {
				t.Fatalf("spans %v, want %v", spanList(spans), c.spans)
			}
			root := spanNamed(t, spans, c.spans[0])
			if root.Kind != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("the request's span is of kind %v", root.Kind)
			}
			if rcv.service[root] != "gw-test" {
				t.Errorf("service.name %q", rcv.service[root])
			}
			traceID := hex.EncodeToString(root.TraceId)
			if c.header[0] == "Traceparent" {
				in := parseTraceparent(t, clientTP)
				if traceID != in.traceID || hex.EncodeToString(root.ParentSpanId) != in.spanID {
					t.Errorf("trace %s parent %x: the client's trace not continued", traceID, root.ParentSpanId)
				}
				if root.TraceState != "vendor=x" {
					t.Errorf("tracestate %q", root.TraceState)
				}
			} else if len(root.ParentSpanId) != 0 {
				t.Errorf("a request without traceparent has parent %x", root.ParentSpanId)
			}
			for i, name := range c.spans {
				sp := spanNamed(t, spans, name)
				if got := took(sp); got != c.took[i] {
					t.Errorf("%s took %v, want %v", name, got, c.took[i])
				}
				if i > 0 && (!bytes.Equal(sp.ParentSpanId, root.SpanId) || !bytes.Equal(sp.TraceId, root.TraceId)) {
					t.Errorf("%s is not the request span's child", name)
				}
			}
			up := spanNamed(t, spans, "upstream")
			if up.Kind != tracepb.Span_SPAN_KIND_CLIENT || up.StartTimeUnixNano != root.StartTimeUnixNano {
				t.Errorf("upstream: kind %v, starts %v after the request", up.Kind, time.Duration(up.StartTimeUnixNano-root.StartTimeUnixNano))
			}
			if len(c.spans) == 3 {
				st := spanNamed(t, spans, "stream")
				if st.StartTimeUnixNano != up.EndTimeUnixNano || st.EndTimeUnixNano != root.EndTimeUnixNano {
					t.Error("the stream span does not run from the answer to the request's end")
				}
			}

			// The backend continues the trace under the upstream span.
			got := rb.headers()
			if len(got) != 1 {
				t.Fatalf("%d requests reached the backend", len(got))
			}
			tp := parseTraceparent(t, got[0].Get("Traceparent"))
			if tp.traceID != traceID || tp.spanID != hex.EncodeToString(up.SpanId) || tp.flags != "01" {
				t.Errorf("the backend got traceparent %s; upstream span %x of trace %s", got[0].Get("Traceparent"), up.SpanId, traceID)
			}
			if c.header[0] == "Traceparent" && got[0].Get("Tracestate") != "vendor=x" {
				t.Errorf("the backend got tracestate %q", got[0].Get("Tracestate"))
			}

			want := map[string]any{"kvgate.tenant": "acme", "kvgate.class": "standard", "kvgate.gpu": "gpu0", "kvgate.backend": "gpu0",
				"kvgate.outcome": "ok", "kvgate.reason": "", "gen_ai.request.model": "llama-3-8b", "http.response.status_code": int64(200),
				"http.route": c.path, "kvgate.queue_wait_ms": 0.0}
			for k, v := range want {
				var got any
				switch a := attrOf(root.Attributes, k); {
				case a == nil:
				case a.GetValue() == nil:
				default:
					switch v.(type) {
					case string:
						got = a.GetStringValue()
					case int64:
						got = a.GetIntValue()
					case float64:
						got = a.GetDoubleValue()
					}
				}
				if got != v {
					t.Errorf("%s = %#v, want %#v", k, got, v)
				}
			}
			for _, k := range []string{"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "kvgate.kv_reserved_bytes"} {
				if a := attrOf(root.Attributes, k); a.GetIntValue() <= 0 {
					t.Errorf("%s = %v, want > 0", k, a)
				}
			}
			for _, sp := range spans {
				for _, kv := range sp.Attributes {
					if s := kv.Value.GetStringValue(); strings.Contains(s, "key-acme") || strings.Contains(s, "hello there") {
						t.Errorf("span %s holds a key or a prompt: %s=%s", sp.Name, kv.Key, s)
					}
				}
			}
		})
	}
}

// A request that waited for admission has a span for the wait, as long as
// the gateway's clock says it waited.
func TestTracingQueueSpan(t *testing.T) {
	_, simURL := startSim(t, nil)
	rcv := startReceiver(t)
	rb := startRecording(t, simURL)
	hold := make(chan struct{})
	rb.hook(func(r *http.Request) {
		if r.Header.Get("X-Request-Id") == "first" {
			<-hold
		}
	}, nil)
	clock := newClock()
	gw, gwURL := startGateway(t, baseConfig(rb.url, "admission: {mode: count, max_concurrency: 1}\n"+tracingYAML(rcv.url, "")), Options{Clock: clock})
	first := make(chan result, 1)
	go func() {
		first <- postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 3, false), "X-Request-Id", "first")
	}()
	eventually(t, "the first request at the backend", func() bool { return len(rb.headers()) == 1 })
	second := make(chan result, 1)
	go func() {
		second <- postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 3, false), "X-Request-Id", "second")
	}()
	admissiontest.WaitQueued(gw.sched, 1)
	clock.Advance(2 * time.Second)
	close(hold)
	for _, ch := range []chan result{first, second} {
		if r := <-ch; r.err != nil || r.status != 200 {
			t.Fatalf("%d %v %s", r.status, r.err, r.body)
		}
	}
	spans := rcv.flushUntil(t, gw, 5)
	queue := spanNamed(t, spans, "admission.queue")
	if got := took(queue); got != 2*time.Second {
		t.Errorf("admission.queue took %v, want 2s", got)
	}
	var parent *tracepb.Span
	for _, sp := range spans {
		if bytes.Equal(sp.SpanId, queue.ParentSpanId) {
			parent = sp
		}
	}
	if parent == nil || parent.Name != "POST /v1/chat/completions" || parent.StartTimeUnixNano != queue.StartTimeUnixNano {
		t.Fatalf("admission.queue's parent: %v", parent)
	}
	if w := attrOf(parent.Attributes, "kvgate.queue_wait_ms").GetDoubleValue(); w != 2000 {
		t.Errorf("kvgate.queue_wait_ms = %v", w)
	}
	if n := len(spans); n != 5 {
		t.Errorf("spans %v: want two requests and upstreams, one queue", spanList(spans))
	}
}

// sample_ratio decides for the traces that begin at the gateway; a client's
// traceparent decides for its own. Either way the backend is sent a
// traceparent, so that its spans follow the same decision.
func TestTracingSampling(t *testing.T) {
	_, simURL := startSim(t, nil)
	const sampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
	cases := []struct {
		name, ratio, clientTP string
		exported              bool
	}{
		{"ratio 0, no traceparent", "0", "", false},
		{"ratio 0, sampled traceparent", "0", sampled, true},
		{"ratio 1, unsampled traceparent", "1", unsampled, false},
		{"ratio 1, no traceparent", "1", "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rcv := startReceiver(t)
			rb := startRecording(t, simURL)
			gw, gwURL := startGateway(t, baseConfig(rb.url, tracingYAML(rcv.url, "  sample_ratio: "+c.ratio+"\n")), Options{})
			var header []string
			if c.clientTP != "" {
				header = []string{"Traceparent", c.clientTP}
			}
			if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 3, false), header...); r.err != nil || r.status != 200 {
				t.Fatalf("%d %v %s", r.status, r.err, r.body)
			}
			// A non-streamed request's spans end before its answer leaves.
			if err := gw.tracing.cur.Load().tp.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := len(rcv.all()) > 0; got != c.exported {
				t.Errorf("exported %v, want %v", spanList(rcv.all()), c.exported)
			}
			tp := parseTraceparent(t, rb.headers()[0].Get("Traceparent"))
			wantFlags := map[bool]string{true: "01", false: "00"}[c.exported]
			if tp.flags != wantFlags {
				t.Errorf("the backend's traceparent has flags %s, want %s", tp.flags, wantFlags)
			}
			if c.clientTP != "" {
				in := parseTraceparent(t, c.clientTP)
				if tp.traceID != in.traceID || tp.spanID == in.spanID {
					t.Errorf("the backend got %v for the client's %v", tp, in)
				}
			}
		})
	}
}

// A reload that changes the tracing section exports the requests that
// arrive after it with the new one; a request that began before it keeps
// the old exporter, which is shut down — its spans flushed — once that
// request has finished. Turned off, the client's headers go through as
// they came.
func TestTracingReload(t *testing.T) {
	_, simURL := startSim(t, nil)
	rcv := startReceiver(t)
	rb := startRecording(t, simURL)
	yamlFor := func(tracing string) *Config {
		cfg, err := Parse([]byte(baseConfig(rb.url, tracing)), ".")
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	gw, gwURL := startGateway(t, baseConfig(rb.url, tracingYAML(rcv.url, "  service_name: before\n")), Options{})
	old := gw.tracing.acquire() // a request in flight across the reload
	_, inFlight := old.t.Start(context.Background(), "in flight")

	if err := gw.Reload(yamlFor(tracingYAML(rcv.url, "  service_name: after\n"))); err != nil {
		t.Fatal(err)
	}
	if gw.tracing.cur.Load() == old {
		t.Fatal("the reload kept the old tracer")
	}
	if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 3, false)); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	spans := rcv.flushUntil(t, gw, 2)
	for _, sp := range spans {
		if rcv.service[sp] != "after" {
			t.Errorf("%s exported as %q after the reload", sp.Name, rcv.service[sp])
		}
	}
	inFlight.End()
	old.release()
	eventually(t, "the old tracer to flush the span in flight and stop", func() bool {
		gw.tracing.mu.Lock()
		defer gw.tracing.mu.Unlock()
		return !gw.tracing.live[old]
	})
	sp := spanNamed(t, rcv.all(), "in flight")
	if rcv.service[sp] != "before" {
		t.Errorf("the span in flight exported as %q", rcv.service[sp])
	}

	if err := gw.Reload(yamlFor("")); err != nil {
		t.Fatal(err)
	}
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 3, false), "Traceparent", tp); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	got := rb.headers()
	if last := got[len(got)-1].Get("Traceparent"); last != tp {
		t.Errorf("with tracing off the backend got %q", last)
	}
	eventually(t, "every tracer to stop", func() bool {
		gw.tracing.mu.Lock()
		defer gw.tracing.mu.Unlock()
		return len(gw.tracing.live) == 0
	})
}

// The collector's headers go with every export, and none reaches a log.
func TestTracingHeaders(t *testing.T) {
	_, simURL := startSim(t, nil)
	rcv := startReceiver(t)
	var logs syncbuf.Buffer
	gw, gwURL := startGateway(t, baseConfig(simURL, tracingYAML(rcv.url, "  headers: {Authorization: Bearer collector-secret}\n")),
		Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 3, false)); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	rcv.flushUntil(t, gw, 1)
	rcv.mu.Lock()
	auth := append([]string(nil), rcv.auth...)
	rcv.mu.Unlock()
	if len(auth) == 0 || auth[0] != "Bearer collector-secret" {
		t.Errorf("the collector got Authorization %q", auth)
	}
	if strings.Contains(logs.String(), "collector-secret") {
		t.Errorf("a collector credential was logged:\n%s", logs.String())
	}
}

func TestTracingConfig(t *testing.T) {
	cases := []struct {
		name, yaml string
		err        string // in the error; "" for none
		url        string // the resolved export URL
	}{
		{"absent: off", "", "", ""},
		{"base URL gets the traces path", "tracing: {otlp_endpoint: 'http://collector:4318'}", "", "http://collector:4318/v1/traces"},
		{"root path too", "tracing: {otlp_endpoint: 'https://collector/'}", "", "https://collector/v1/traces"},
		{"a path is kept", "tracing: {otlp_endpoint: 'https://otlp.example.com/otlp/v1/traces'}", "", "https://otlp.example.com/otlp/v1/traces"},
		{"full", "tracing: {otlp_endpoint: 'http://c:4318', service_name: gw, sample_ratio: 0.25, headers: {X-Api-Key: k}}", "", "http://c:4318/v1/traces"},
		{"gRPC scheme", "tracing: {otlp_endpoint: 'grpc://c:4317'}", "tracing.otlp_endpoint: \"grpc://c:4317\" is not an http:// or https:// URL", ""},
		{"no scheme", "tracing: {otlp_endpoint: 'collector:4318'}", "tracing.otlp_endpoint:", ""},
		{"no host", "tracing: {otlp_endpoint: 'http:///v1/traces'}", "tracing.otlp_endpoint: \"http:///v1/traces\" names no host", ""},
		{"credentials in the URL", "tracing: {otlp_endpoint: 'https://u:secret@c'}", "tracing.otlp_endpoint: holds credentials", ""},
		{"query", "tracing: {otlp_endpoint: 'https://c/v1/traces?x=1'}", "tracing.otlp_endpoint: \"https://c/v1/traces?x=1\" has a query", ""},
		{"ratio above 1", "tracing: {otlp_endpoint: 'http://c', sample_ratio: 1.5}", "tracing.sample_ratio: 1.5 is not in [0, 1]", ""},
		{"negative ratio", "tracing: {sample_ratio: -0.1}", "tracing.sample_ratio: -0.1 is not in [0, 1]", ""},
		{"ratio not a number", "tracing: {sample_ratio: half}", "tracing.sample_ratio: want a number", ""},
		{"service name spaced", "tracing: {service_name: ' gw'}", "tracing.service_name:", ""},
		{"bad header name", "tracing: {headers: {'X Key': v}}", "tracing.headers.X Key: not a valid HTTP header name", ""},
		{"header value with a newline", "tracing: {headers: {X-Key: \"a\\nb\"}}", "tracing.headers.X-Key: the value holds a line break", ""},
		{"headers a list", "tracing: {headers: [a]}", "tracing.headers", ""},
		{"unknown key", "tracing: {endpoint: 'http://c'}", "tracing.endpoint: unknown key", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(baseConfig("http://127.0.0.1:1", c.yaml+"\n")), ".")
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc := cfg.Tracing
			if tc.on() != (c.url != "") || c.url != "" && tc.endpointURL() != c.url {
				t.Errorf("on %v, url %q; want %q", tc.on(), tc.endpointURL(), c.url)
			}
			if c.name == "absent: off" && (tc.ServiceName != "kvgate" || tc.sampleRatio() != 1) {
				t.Errorf("defaults: service_name %q, sample_ratio %v", tc.ServiceName, tc.sampleRatio())
			}
		})
	}
}
