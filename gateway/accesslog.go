package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/valyala/fasthttp"
)

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
// is kept with the access log off; with it on, a few strings, no map.
func (x *exchange) noteAccess(ctx *fasthttp.RequestCtx, route string) {
	if !x.rt.cfg.Log.access() {
		return
	}
	a := &x.access
	a.on, a.rc, a.route = true, ctx, route
	h := &ctx.Request.Header
	a.id = string(h.Peek(headerRequestID)) // made sane by stampRequestID
	a.method = methodName(ctx.Method())
	a.client = ctx.RemoteAddr().String()
	a.forwardedFor = clipped(h.Peek("X-Forwarded-For"))
	a.userAgent = clipped(h.UserAgent())
	a.bytesIn = len(ctx.Request.Body())
	a.traceID = traceparentID(h.Peek("Traceparent"))
}

// accessRecord is an exchange's part of its access line.
type accessRecord struct {
	on                   bool
	id, method, route    string
	client, forwardedFor string
	userAgent            string
	traceID              string // the client's trace, until the gateway's span has one
	bytesIn              int
	// rc is read for the status of an answer the handler wrote: finish
	// runs on the handler's goroutine then. A stream's status is its 200.
	rc     *fasthttp.RequestCtx
	ttft   time.Duration // 0 until the first token
	waited time.Duration // in the queue, for a request refused after waiting
	// sent counts a stream's bytes as the relay flushes them; nil for an
	// answer the handler wrote.
	sent *countWriter
}

// maxLoggedHeader bounds a header the access line copies from the client.
const maxLoggedHeader = 256

func clipped(v []byte) string { return string(v[:min(len(v), maxLoggedHeader)]) }

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
	if !a.on || !x.s.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	waited := x.queueWait()
	prompt, output := x.tokens()
	upstreamAddr, upstream := "", time.Duration(0)
	if x.backend != nil {
		upstreamAddr = x.backend.Addr()
		upstream = x.s.now().Sub(x.sentAt)
	}
	traceID := a.traceID
	if x.trace != nil {
		traceID = x.trace.span.SpanContext().TraceID().String()
	}
	x.s.log.LogAttrs(context.Background(), slog.LevelInfo, "request",
		slog.String("id", a.id),
		slog.String("method", a.method),
		slog.String("route", a.route),
		slog.String("client", a.client),
		slog.String("x_forwarded_for", a.forwardedFor),
		slog.String("user_agent", a.userAgent),
		slog.String("tenant", x.tenant),
		slog.String("model", x.label),
		slog.String("gpu", x.gpuName()),
		slog.String("backend", x.backendName()),
		slog.String("upstream_addr", upstreamAddr),
		slog.Int("retries", max(x.attempts-1, 0)),
		slog.Int("status", x.answerStatus(a.rc, outcome)),
		slog.String("outcome", outcome),
		slog.String("reason", reason),
		slog.Float64("queue_wait_ms", ms(waited)),
		slog.Float64("ttft_ms", ms(a.ttft)),
		slog.Float64("upstream_ms", ms(upstream)),
		slog.Float64("duration_ms", ms(total)),
		slog.Int("bytes_in", a.bytesIn),
		slog.Int64("bytes_out", x.bytesOut(a.rc)),
		slog.Int("prompt_tokens", prompt),
		slog.Int("output_tokens", output),
		slog.Int64("kv_reserved_bytes", x.res.weight()),
		slog.String("trace_id", traceID),
	)
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

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
