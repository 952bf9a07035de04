package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/internal/accesslog"
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
