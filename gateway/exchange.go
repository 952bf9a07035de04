package gateway

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/jsonscan"
)

// Causes of a request's context ending, told apart when it does.
var (
	errClientGone     = errors.New("client disconnected")
	errRequestTimeout = errors.New("request timeout")
	errShutdown       = errors.New("gateway shutting down")
	// errFirstByteTimeout: a streamed request's backend sent no event
	// within its first_byte_timeout.
	errFirstByteTimeout = errors.New("first byte timeout")
	// errStoppedForMemory: the admission guard stopped the request, so
	// that the GPU's KV cache stays within its budget when the requests
	// running there outgrew their forecast.
	errStoppedForMemory = errors.New("stopped to keep the GPU within its KV budget")
)

// exchange is one proxied request from arrival to its last byte: its
// life. It holds everything that must be given back — the admission
// ticket, the client watch (in its flight), the request context — and
// finish gives it all back exactly once, whichever way the request
// leaves. Its other roles are types of their own, embedded: the counting
// of its tokens (tally, tally.go), the relay of its stream (relay,
// relay.go), and what is recorded of it (records).
type exchange struct {
	s     *Server
	rt    *runtime
	start time.Time
	label string // model label for metrics ("unknown" until the model is known)

	req *request
	m   *model
	who // the tenant and class it is admitted as

	rctx reqCtx // the request's context (reqctx.go)
	fl   flight // in the server's set of requests in flight, its client watched (inflight.go)

	hold                      // the admission held
	backend *backends.Backend // the backend sent to last

	tally
	relay
	records

	done bool
}

// who is the client a request is admitted for: its tenant (by its API
// key) and its priority class.
type who struct{ tenant, class string }

// hold is the admission a request holds: the ticket, in the exchange
// itself so that an admission that fits at once allocates nothing
// (ticketBuf), or a continuation's (loop.go: admit).
type hold struct {
	ticket    *admission.Ticket // &ticketBuf once admitted, or the continuation's
	ticketBuf admission.Ticket
}

// records are what is written of a request at its finish: its access
// line and its spans.
type records struct {
	access accessRecord // accesslog.go
	trace  *reqTrace    // trace.go; nil with tracing off
}

func (s *Server) newExchange(ctx *fasthttp.RequestCtx, rt *runtime) *exchange {
	x := &exchange{s: s, rt: rt, start: s.now(), label: "unknown"}
	x.fl.watch.conn = ctx.Conn()
	x.rctx.deadline = x.start.Add(rt.cfg.Server.RequestTimeout.D)
	x.rctx.waiting = s.wake
	x.rctx.linger = rt.cfg.Admission.AbortHold.D
	s.m.inflight.Inc()
	s.active.Add(1)
	s.flights.add(x)
	if s.stopping.Load() {
		x.rctx.cancel(errShutdown)
	}
	s.wakeSweep()
	return x
}

// watchClient has the client's hang-up end the request's context; the
// sweep calls it once the request waits (inflight.go).
func (x *exchange) watchClient() { x.fl.watch.start(x.s.watch, x.hangUp) }

// finish records the outcome and releases everything. Later calls do
// nothing, so every exit path may call it.
func (x *exchange) finish(outcome, reason string) {
	if x.done {
		return
	}
	x.done = true
	x.s.flights.remove(x)
	x.stopFirstByte()
	x.fl.watch.end()
	if x.ticket != nil && x.rctx.Cause() == nil {
		// A context that ended first gave the ticket up itself, lingering
		// while the backend may still hold the blocks (reqctx.go).
		x.ticket.Release()
	}
	x.rctx.cancel(context.Canceled)
	m := x.s.m
	m.inflight.Dec()
	x.s.active.Add(-1)
	took := x.s.now().Sub(x.start)
	if x.m != nil && outcome == outcomeOK && reason == "" {
		ms := m.forModel(x.m.name)
		ms.ok.Inc()
		ms.okDur.Observe(took.Seconds())
	} else {
		m.requests.WithLabelValues(x.label, outcome, reason).Inc()
		m.duration.WithLabelValues(x.label, outcome).Observe(took.Seconds())
	}
	if x.hasUsage {
		x.recordUsage()
	}
	x.logAccess(outcome, reason, took)
	x.trace.end(x, outcome, reason, took)
	if x.resume != nil {
		x.resume.free() // the pointer stays: the guard may read it still
	}
}

// fail answers with e, when there is a client to answer, and finishes.
func (x *exchange) fail(ctx *fasthttp.RequestCtx, e *apiError, outcome, reason string) {
	if e != nil {
		e.write(ctx)
		if e.status == statusClientClosed {
			ctx.SetConnectionClose() // it sends nothing more
		}
	}
	x.finish(outcome, reason)
}

// failEnded finishes a request whose context ended, answering when there is
// still a client to answer.
func (x *exchange) failEnded(ctx *fasthttp.RequestCtx) bool {
	outcome, reason, e := x.ended()
	if outcome == "" {
		return false
	}
	x.fail(ctx, e, outcome, reason)
	return true
}

func (x *exchange) clientGone() { x.rctx.cancel(errClientGone) }

// StopForMemory is the admission guard stopping the request (see
// admission's guard.go). A stream that can be resumed has its upstream
// exchange cut and its reservation lingered until the backend has let the
// blocks go, and the relay sends it again when it fits (resume.go). Any
// other has its context end, which does the same and has the relay end
// the stream with an error event.
func (x *exchange) StopForMemory() {
	if x.resume != nil && x.rctx.preempt() {
		return
	}
	x.rctx.cancel(errStoppedForMemory)
}

// Resumable says whether the guard's stop would resume the stream rather
// than end it (admission.ResumableStopper): it is one kept to be resumed,
// and nothing it generated has taken that away yet.
func (x *exchange) Resumable() bool { return x.resume != nil && !x.resume.lost.Load() }

var _ admission.ResumableStopper = (*exchange)(nil)

// answer answers the client from the first turn's upstream: a whole
// answer is passed on as it is, a stream relayed (stream, relay.go), which
// then owns the exchange's finish.
func (x *exchange) answer(ctx *fasthttp.RequestCtx, up upstream) {
	copyBackendHeaders(ctx, up.resp)
	if up.er == nil {
		x.passBody(ctx, up.resp)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	x.streaming = true            // from here the relay owns finish
	x.stage.Store(stageStreaming) // see hangUp
	x.body = sseBody{x: x, up: up}
	if !ctx.Request.Header.IsHTTP11() {
		x.body.closeDelimited(ctx, x.rt.cfg.Server.WriteTimeout.D)
		return
	}
	ctx.Response.SetBodyStream(&x.body, -1)
}

// passBody relays a whole (non-streamed) answer: the backend's status and
// body as they are, its usage read on the way for calibration and metrics.
func (x *exchange) passBody(ctx *fasthttp.RequestCtx, resp *backends.Response) {
	defer resp.Release()
	bp := bodyBufs.Get().(*[]byte)
	body, err := resp.ReadInto((*bp)[:0], x.backend.MaxBody())
	defer func() {
		if cap(body) <= maxPooledBody {
			*bp = body[:0]
			bodyBufs.Put(bp)
		}
	}()
	if err != nil {
		x.refuse(ctx, err)
		return
	}
	status := resp.Status()
	ctx.SetStatusCode(status)
	if ct := resp.Header.ContentType(); len(ct) > 0 {
		ctx.Response.Header.SetContentTypeBytes(ct)
	}
	ctx.SetBody(x.renameModel(body))
	switch {
	case status < 300:
		p := x.s.parsers.Get()
		if v, err := p.ParseBytes(body); err == nil {
			x.readUsage(v.Get("usage"))
			x.learnWhole(v)
		}
		x.s.parsers.Put(p)
		x.finish(outcomeOK, "")
	case status >= 500:
		x.s.m.upstreamErrors.WithLabelValues(x.backend.Name(), "status").Inc()
		if bytes.Contains(body, outOfMemory) {
			x.overflowed()
		}
		x.finish(outcomeFailed, "backend_"+strconv.Itoa(status))
	default:
		x.finish(outcomeRejected, "backend_"+strconv.Itoa(status))
	}
}

// bodyBufs are the buffers non-streamed answers are read into before
// fasthttp copies them into the response; one of up to maxPooledBody bytes
// goes back for the next answer.
var bodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

const maxPooledBody = 1 << 20

// copyBackendHeaders passes on the backend's headers a client may act on.
// Their names are compared as fasthttp normalizes them (Peek would copy
// each name into the header's buffer first). The backend's X-Request-Id is
// not among them: the client keeps the gateway's, which the backend was
// sent and the access log holds.
func copyBackendHeaders(ctx *fasthttp.RequestCtx, resp *backends.Response) {
	for k, v := range resp.Header.All() {
		if len(v) > 0 && string(k) == "Retry-After" {
			ctx.Response.Header.SetCanonical(k, v)
		}
	}
}

// renameModel gives the client back the model name it sent (served_name)
// where the backend's answer names its own: the "model" member of a body
// or of a stream's event. A member's quotes in a JSON string value would be
// escaped, so the pattern cannot match inside the generated text. Without
// an alias it returns b as it is, allocating nothing.
func (x *exchange) renameModel(b []byte) []byte {
	if x.req.alias == "" {
		return b
	}
	if x.req.renames == nil {
		from, to := jsonscan.AppendString(nil, x.req.model), jsonscan.AppendString(nil, x.req.alias)
		for _, sep := range []string{`"model":`, `"model": `} {
			x.req.renames = append(x.req.renames, [2][]byte{append([]byte(sep), from...), append([]byte(sep), to...)})
		}
	}
	for _, r := range x.req.renames {
		b = bytes.ReplaceAll(b, r[0], r[1])
	}
	return b
}

// outOfMemory is what the error of a backend that ran out of KV blocks
// says (PyTorch's "CUDA out of memory", the simulator's too).
var outOfMemory = []byte("out of memory")

// overflowed tells admission that the request's GPU ran out of memory:
// every forecast made for it is distrusted for the cool-down.
func (x *exchange) overflowed() {
	if x.ticket == nil || x.rt.count {
		return
	}
	id := x.ticket.GPU()
	x.rt.sched.Overflowed(id)
	gpu := id
	if g := x.rt.gpuByID[id]; g != nil {
		gpu = g.name
	}
	x.s.m.overflows.WithLabelValues(gpu).Inc()
	x.s.gpuOutOfMemory(x.rt, gpu)
	x.s.log.Warn("a backend ran out of KV memory: the GPU goes to worst-case admission for the cool-down", "gpu", gpu, "backend", x.backend.Name())
}
