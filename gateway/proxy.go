package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/kvgate/kvgate/kvbudget"
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

// guardRetryAfter is what a request the guard stopped is told: the
// requests that outgrew the forecast hold the room it needs for some
// seconds, while the GPU is on worst-case admission.
const guardRetryAfter = 2 * time.Second

// exchange is one proxied request from arrival to its last byte. It holds
// everything that must be given back — the admission ticket, the client
// watch, the request context — and finish gives it all back exactly once,
// whichever way the request leaves.
type exchange struct {
	s     *Server
	rt    *runtime
	start time.Time
	label string // model label for metrics ("" until the model is known)

	req    *request
	m      *model
	class  string
	tenant string

	// ctx is &rctx, the request's context (reqctx.go).
	ctx  context.Context
	rctx reqCtx
	fl   flight   // in the server's set of requests in flight
	conn net.Conn // the client's, watched for a hang-up once it waits

	wmu        sync.Mutex // guards watchStop and watchEnded
	watchStop  func() bool
	watchEnded bool // finished: the client is never watched again
	// stage and hungUp let a stream under way outlive a hang-up report
	// (see hangUp); both are atomics, read by the watch's goroutine.
	stage  atomic.Int32 // stageBefore, stageStreaming or stageDone
	hungUp atomic.Bool  // the watch reported a hang-up during the stream

	ticket *admission.Ticket // &ticketBuf once admitted
	res    reservation
	one    oneChoice // res's slices, for one prompt and one choice
	// ticketBuf is the admission held, in the exchange itself so that an
	// admission that fits at once allocates nothing.
	ticketBuf admission.Ticket
	backend   *backends.Backend

	predicted int // prompt tokens reserved, all prompts
	// counts and exact hold countPrompts' answer for a single prompt.
	counts    [1]int
	exact     [1]bool
	injectMax int // max_tokens the gateway adds to the body (the model's default); 0 = none
	// alias is the model's served_name the client sent ("" when it sent
	// the model's own name): the backend is sent req.model, the client
	// sees alias in answers; renames are the patterns renameModel swaps.
	alias    string
	renames  [][2][]byte
	firstTok bool
	lastTok  time.Time // the first choice's last token, for the inter-token latency
	usage    struct{ prompt, completion int }
	hasUsage bool

	// source is how the prompts were counted (sourceBackend, ...); "" for
	// token ids only. A single prompt counted from the model's tokenize
	// cache keeps its key, to be checked against the usage reported.
	source     string
	cacheHit   bool
	cacheKey   tokenKey
	cacheCount int

	body sseBody // a streamed answer, relayed as fasthttp writes it

	access accessRecord // accesslog.go

	done bool
}

func (s *Server) newExchange(ctx *fasthttp.RequestCtx, rt *runtime) *exchange {
	x := &exchange{s: s, rt: rt, start: s.now(), label: "unknown", conn: ctx.Conn()}
	x.rctx.deadline = x.start.Add(rt.cfg.Server.requestTimeout())
	x.rctx.waiting = s.wake
	x.rctx.linger = rt.cfg.Admission.abortHold()
	x.ctx = &x.rctx
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
// sweep calls it once the request waits (inflight.go). It holds wmu across
// the registration, which only the request's own finish waits for.
func (x *exchange) watchClient() {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	if x.watchEnded || x.conn == nil {
		return
	}
	if stop, err := x.s.watch.Watch(socketOf(x.conn), x.hangUp); err == nil {
		x.watchStop = stop
	}
}

// unwatch stops watching the client, for good.
func (x *exchange) unwatch() {
	x.wmu.Lock()
	x.watchEnded = true
	stop := x.watchStop
	x.watchStop = nil
	x.wmu.Unlock()
	if stop != nil {
		stop()
	}
}

// finish records the outcome and releases everything. Later calls do
// nothing, so every exit path may call it.
func (x *exchange) finish(outcome, reason string) {
	if x.done {
		return
	}
	x.done = true
	x.s.flights.remove(x)
	x.stopFirstByte()
	x.unwatch()
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
}

// fail answers with e and finishes.
func (x *exchange) fail(ctx *fasthttp.RequestCtx, e *apiError, outcome, reason string) {
	e.write(ctx)
	x.finish(outcome, reason)
}

// ended reports how the request's context ended, if it has.
func (x *exchange) ended() (outcome, reason string, e *apiError) {
	switch cause := x.rctx.Cause(); {
	case cause == nil:
		return "", "", nil
	case errors.Is(cause, errRequestTimeout):
		return outcomeFailed, "request_timeout", &apiError{status: 504, typ: typeServer, code: "upstream_timeout",
			message: fmt.Sprintf("The request did not complete within %s.", x.rt.cfg.Server.requestTimeout())}
	case errors.Is(cause, errFirstByteTimeout):
		name, d := "", time.Duration(0)
		if x.backend != nil {
			name, d = x.backend.Name(), x.backend.FirstByteTimeout()
		}
		return outcomeFailed, "first_byte_timeout", &apiError{status: 504, typ: typeServer, code: "upstream_timeout",
			message: fmt.Sprintf("The backend %q sent nothing within %s (its first_byte_timeout).", name, d)}
	case errors.Is(cause, errShutdown):
		return outcomeFailed, "shutdown", &apiError{status: 503, typ: typeServer, code: "shutting_down", message: "The gateway is shutting down."}
	case errors.Is(cause, errStoppedForMemory):
		return outcomeShed, reasonGuard, &apiError{status: 503, typ: typeServer, code: reasonGuard, retryAfter: guardRetryAfter,
			message: fmt.Sprintf("The requests running on this GPU outgrew their forecast: this one was stopped to keep its KV cache within budget before the backend ran out of memory. Retry after %s.", retryAfterText(guardRetryAfter))}
	default:
		// The client hung up, or only shut its sending side (connwatch
		// cannot tell the two apart). One that still reads must not take
		// what it gets for a whole answer: it gets this error, and one that
		// is gone never sees it.
		return outcomeCanceled, "client_disconnect", &apiError{status: statusClientClosed, typ: typeInvalidRequest, code: "client_closed_request",
			message: "The client closed its side of the connection before the answer was complete; the gateway takes that for a hang-up and cancelled the request."}
	}
}

// statusClientClosed is nginx's 499, "client closed request": the client
// ended the exchange itself, so the answer is a client error (4xx), and one
// that still reads learns its request was cancelled, not served.
const statusClientClosed = 499

// failEnded finishes a request whose context ended, answering when there is
// still a client to answer.
func (x *exchange) failEnded(ctx *fasthttp.RequestCtx) bool {
	outcome, reason, e := x.ended()
	if outcome == "" {
		return false
	}
	if e != nil {
		e.write(ctx)
		if e.status == statusClientClosed {
			ctx.SetConnectionClose() // it sends nothing more
		}
	}
	x.finish(outcome, reason)
	return true
}

func (s *Server) serveCompletion(ctx *fasthttp.RequestCtx, kind endpoint) {
	if s.testHookServe != nil {
		s.testHookServe()
	}
	rt := s.rt.Load()
	x := s.newExchange(ctx, rt)
	x.noteAccess(ctx, kind.path())
	streaming := false
	defer func() {
		if !streaming {
			x.finish(outcomeFailed, "internal") // no-op unless a path forgot to finish
		}
	}()

	tn, ok := rt.authenticate(ctx)
	if !ok {
		x.fail(ctx, unauthorized(), outcomeRejected, "unauthorized")
		return
	}
	if tn != nil {
		x.tenant = tn.name
	}
	p := s.parsers.Get()
	req, err := parseRequest(p, ctx.PostBody(), kind)
	s.parsers.Put(p)
	if err != nil {
		var pe *parseError
		errors.As(err, &pe)
		x.fail(ctx, &apiError{status: 400, typ: typeInvalidRequest, param: pe.param, message: pe.msg}, outcomeRejected, "invalid_request")
		return
	}
	x.req = req
	m := rt.byClientName[req.model]
	if m != nil && m.servedName != m.name {
		// From here on the request is the backend's model; the client's
		// name goes back into the body forwarded and the answers.
		x.alias, req.model = req.model, m.name
	}
	if m == nil {
		x.fail(ctx, &apiError{status: 404, typ: typeInvalidRequest, param: "model", code: "model_not_found",
			message: fmt.Sprintf("The model `%s` does not exist.", req.model)}, outcomeRejected, "unknown_model")
		return
	}
	x.m, x.label = m, m.name
	if e := req.outOfRange(m.maxLen); e != nil {
		x.fail(ctx, e, outcomeRejected, "invalid_request")
		return
	}
	if m.tokenizer == "backend" {
		if err := promptTexts(&s.parsers, ctx.PostBody(), req); err != nil {
			s.log.Error("find the prompts of a parsed request", "err", err)
			x.fail(ctx, &apiError{status: 500, typ: typeServer, code: "internal_error", message: "internal error"}, outcomeFailed, "internal")
			return
		}
	}
	if x.class, err = rt.classFor(tn, ctx.Request.Header.Peek(rt.cfg.Admission.PriorityHeader)); err != nil {
		x.fail(ctx, &apiError{status: 400, typ: typeInvalidRequest, param: rt.cfg.Admission.PriorityHeader, message: err.Error()}, outcomeRejected, "invalid_request")
		return
	}

	if !rt.pool.Serves(req.model) {
		x.fail(ctx, noBackend(req.model), outcomeFailed, "no_backend")
		return
	}
	prompts, exact, err := x.countPrompts()
	if errors.Is(err, backends.ErrNoBackend) {
		x.fail(ctx, noBackend(req.model), outcomeFailed, "no_backend")
		return
	}
	if err != nil {
		if !x.failEnded(ctx) {
			x.fail(ctx, &apiError{status: 500, typ: typeServer, code: "internal_error", message: "internal error"}, outcomeFailed, "internal")
		}
		return
	}
	if e := x.reserve(prompts, exact); e != nil {
		x.fail(ctx, e, outcomeRejected, e.code)
		return
	}

	// The queue wait ends at the class's timeout or when the request as a
	// whole would time out, whichever is first; the scheduler sheds at once
	// a request whose expected wait already passes that.
	areq := admission.Request{Queue: req.model, Class: x.class, Tenant: x.tenant, Opaque: !req.stream,
		Pinned: req.pinned, Deadline: x.start.Add(rt.cfg.Server.requestTimeout())}
	if req.stream {
		areq.Stopper = x
	}
	if rt.count {
		areq.Weight = 1
	} else {
		areq.Shape = x.res.shape()
	}
	if rt.cfg.Routing == routingAffinity {
		areq.Affinity = x.affinity(ctx)
	}
	s.flights.admitting(x)
	err = rt.sched.AcquireTicket(x.ctx, areq, &x.ticketBuf)
	s.flights.admitted(x)
	if err != nil {
		x.admissionFailed(ctx, err)
		return
	}
	x.ticket = &x.ticketBuf
	x.rctx.releaseOnEnd(x.ticket)
	if w := x.ticket.Waited(); w > 0 {
		ctx.Response.Header.Set("X-Kvgate-Queue-Ms", strconv.FormatInt(w.Milliseconds(), 10))
	}

	resp, err := x.forward(ctx)
	if err != nil {
		x.upstreamFailed(ctx, err)
		return
	}
	ctx.Response.Header.Set("X-Kvgate-Backend", x.backend.Name())
	copyBackendHeaders(ctx, resp)
	if resp.Status() == fasthttp.StatusOK && req.stream && resp.IsEventStream() {
		// The client is promised a 200 only once the first event is here:
		// until then a backend that hangs can still get a 504.
		er := newEventReader(resp, rt.cfg.Server.MaxSSELineBytes.Bytes)
		first, err := er.next()
		if err != nil {
			er.release()
			resp.Release()
			if errors.Is(err, io.EOF) {
				err = errStreamTruncated
			}
			x.upstreamFailed(ctx, err)
			return
		}
		x.answered()
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetContentType("text/event-stream")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		ctx.Response.Header.Set("X-Accel-Buffering", "no")
		streaming = true              // from here the relay owns finish
		x.stage.Store(stageStreaming) // see hangUp
		x.body = sseBody{x: x, resp: resp, er: er, first: first}
		if !ctx.Request.Header.IsHTTP11() {
			x.body.closeDelimited(ctx, rt.cfg.Server.writeTimeout())
			return
		}
		ctx.Response.SetBodyStream(&x.body, -1)
		return
	}
	x.answered()
	x.passBody(ctx, resp)
}

// armFirstByte starts a streamed request's first-byte clock: if no event
// has come from the backend when it runs out, the sweep ends the request's
// context (errFirstByteTimeout), which closes the upstream exchange,
// releases the reservation and answers 504. A non-streamed answer arrives
// whole, so only server.request_timeout bounds it.
func (x *exchange) armFirstByte(be *backends.Backend) {
	if x.req.stream && x.fl.firstByte.Load() == 0 {
		x.fl.firstByte.Store(x.s.now().Add(be.FirstByteTimeout()).UnixNano())
	}
}

// stopFirstByte stops the first-byte clock; false if it ran out first.
func (x *exchange) stopFirstByte() bool {
	for {
		fb := x.fl.firstByte.Load()
		switch {
		case fb == firstByteFired:
			return false
		case fb == 0 || x.fl.firstByte.CompareAndSwap(fb, 0):
			return true
		}
	}
}

// answered stops the first-byte clock: the backend answers. Unless the
// clock ran out first, that resets the backend's count of timeouts.
func (x *exchange) answered() {
	if !x.stopFirstByte() {
		return
	}
	x.backend.ReportAnswered()
}

// upstreamFailed answers a request whose backend failed before the client
// got anything: 504 if its first byte timed out (a timeout the backend's
// circuit counts), the answer for its ended context if it ended otherwise,
// else 502 naming the backend — never its address, which goes to the log.
func (x *exchange) upstreamFailed(ctx *fasthttp.RequestCtx, err error) {
	x.stopFirstByte()
	if errors.Is(x.rctx.Cause(), errFirstByteTimeout) && x.backend != nil {
		if x.backend.ReportTimeout(errFirstByteTimeout) {
			x.s.backendLog.observe(x.backend, "consecutive first-byte timeouts")
		}
	}
	if x.failEnded(ctx) {
		return
	}
	name := ""
	if x.backend != nil {
		name = x.backend.Name()
	}
	x.s.m.upstreamErrors.WithLabelValues(name, "transport").Inc()
	x.s.log.Warn("backend failed before answering", "backend", name, "err", err)
	x.fail(ctx, &apiError{status: 502, typ: typeServer, code: "upstream_error", message: upstreamProblem(name, err)}, outcomeFailed, "upstream_error")
}

// errNoBackendOnGPU is forward's error when the GPU a request is bound to
// has no backend left to try.
var errNoBackendOnGPU = errors.New("no available backend on the GPU the request was bound to")

// copyBackendHeaders passes on the backend's headers a client may act on.
// Their names are compared as fasthttp normalizes them (Peek would copy
// each name into the header's buffer first).
func copyBackendHeaders(ctx *fasthttp.RequestCtx, resp *backends.Response) {
	for k, v := range resp.Header.All() {
		if len(v) > 0 && (string(k) == "Retry-After" || string(k) == "X-Request-Id") {
			ctx.Response.Header.SetCanonical(k, v)
		}
	}
}

func noBackend(model string) *apiError {
	return &apiError{status: 503, typ: typeServer, code: "no_healthy_backend",
		message: fmt.Sprintf("No healthy backend serves the model `%s` right now.", model)}
}

// authenticate finds the tenant of a request. With no keys configured every
// request is anonymous (nil tenant).
func (rt *runtime) authenticate(ctx *fasthttp.RequestCtx) (*tenant, bool) {
	if !rt.auth {
		return nil, true
	}
	key := bearer(ctx)
	if key == nil {
		return nil, false
	}
	t := rt.tenants[string(key)]
	return t, t != nil
}

// countPrompts counts each prompt's tokens by the model's strategy; exact
// says which counts are the backend's own (or token ids) rather than
// estimates. The backend strategy asks a backend of the model (the one
// with the most room: the request is bound to no GPU yet), picked only
// when the cache cannot answer; where it cannot answer either, the
// calibrated estimate stands in. backends.ErrNoBackend: none is left.
func (x *exchange) countPrompts() (counts []int, exact []bool, err error) {
	var be *backends.Backend
	if len(x.req.shapes) <= len(x.counts) { // one prompt: no allocation
		counts, exact = x.counts[:len(x.req.shapes)], x.exact[:len(x.req.shapes)]
	} else {
		counts, exact = make([]int, len(x.req.shapes)), make([]bool, len(x.req.shapes))
	}
	for i, sh := range x.req.shapes {
		if sh.ids {
			counts[i], exact[i] = sh.tokenIDs, true
			continue
		}
		if x.req.prompts != nil {
			n, err := x.tokenizeCached(&be, i)
			if err == nil {
				counts[i], exact[i] = n, true
				continue
			}
			if x.ctx.Err() != nil || errors.Is(err, backends.ErrNoBackend) {
				return nil, nil, err
			}
			reason := "error"
			if errors.Is(err, backends.ErrTokenizeTimeout) {
				reason = "timeout"
			}
			x.s.m.upstreamErrors.WithLabelValues(be.Name(), "tokenize").Inc()
			x.s.m.tokenizeFalls.WithLabelValues(x.label, reason).Inc()
			x.s.log.Warn("backend tokenize failed; estimating", "backend", be.Name(), "err", err)
		}
		counts[i] = x.m.est.predict(sh)
		x.noteSource(sourceEstimate)
	}
	return counts, exact, nil
}

// reserve turns token counts into the reservation, or into the 400 that a
// request over the model's context length gets. Only an exact count can
// prove a request too long: an estimate errs high on purpose, so where it
// says "too long" the whole context is reserved and the backend judges.
// A model's default_max_tokens is sent to the backend (x.injectMax), or the
// backend would generate past what was reserved.
func (x *exchange) reserve(prompts []int, exact []bool) *apiError {
	m, req := x.m, x.req
	param := "messages"
	if req.kind == completions {
		param = "prompt"
	}
	var outs []int
	if len(prompts) == 1 {
		outs = x.one.outs[:]
	} else {
		outs = make([]int, len(prompts))
	}
	for i, p := range prompts {
		x.predicted += p
		room := m.maxLen - p
		switch {
		case req.maxTokens > 0:
			outs[i] = req.maxTokens
		case m.defaultMax > 0 && m.defaultMax <= room:
			outs[i] = m.defaultMax
		case m.defaultMax > 0 && exact[i]:
			outs[i] = max(room, 1) // vLLM caps its own default to the room left
		default:
			outs[i] = max(room, 0)
		}
		if p+outs[i] <= m.maxLen && room > 0 {
			continue
		}
		if exact[i] {
			return &apiError{status: 400, typ: typeInvalidRequest, code: "context_length_exceeded", param: param,
				message: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
					m.maxLen, p+outs[i], p, outs[i])}
		}
		prompts[i] = min(p, m.maxLen)
		outs[i] = m.maxLen - prompts[i]
	}
	if req.maxTokens == 0 && m.defaultMax > 0 {
		x.injectMax = m.defaultMax
		for i, o := range outs {
			if prompts[i]+m.defaultMax <= m.maxLen {
				x.injectMax = min(x.injectMax, o)
			} else if !exact[i] {
				x.injectMax = 0 // an estimate too long for the default: leave the backend its own
				break
			}
		}
	}
	x.res = newReservation(m.layout, prompts, outs, req.n, req.seqs, &x.one)
	return nil
}

func (x *exchange) admissionFailed(ctx *fasthttp.RequestCtx, err error) {
	reason := admission.ReasonOf(err)
	var rej *admission.RejectError
	if errors.As(err, &rej) {
		x.access.waited = rej.Waited
	}
	switch reason {
	case admission.ReasonCanceled:
		if !x.failEnded(ctx) {
			x.finish(outcomeCanceled, "client_disconnect")
		}
	case admission.ReasonTooLarge:
		e := &apiError{status: 400, typ: typeInvalidRequest, code: "kv_budget_exceeded", param: "max_tokens", noRetry: true,
			message: fmt.Sprintf("This request needs %s of KV cache (%d prompt tokens, up to %d output tokens each, %d sequences), more than the whole budget of any GPU serving model `%s` (%s). %s",
				kvbudget.FormatBytes(x.res.weight()), x.predicted, x.res.maxOut(), x.req.seqs, x.req.model, kvbudget.FormatBytes(rej.Capacity), x.lowerHint())}
		if x.rt.count {
			e.message = fmt.Sprintf("This request cannot be admitted by model `%s`'s concurrency limit.", x.req.model)
		}
		x.fail(ctx, e, outcomeRejected, "kv_budget_exceeded")
	case admission.ReasonTenantQuota:
		// Only a request larger than the tenant's whole share gets here (one
		// that merely finds its tenant at its cap waits): retrying cannot
		// help, and the client is told not to.
		x.fail(ctx, &apiError{status: 429, typ: typeRateLimit, code: reason, noRetry: true,
			message: fmt.Sprintf("This request needs %s of KV cache, more than your tenant may hold at once on any GPU serving model `%s` (%s). %s",
				kvbudget.FormatBytes(x.res.weight()), x.req.model, kvbudget.FormatBytes(rej.Capacity), x.lowerHint())},
			outcomeShed, reason)
	case admission.ReasonNoRoute:
		x.fail(ctx, noBackend(x.req.model), outcomeFailed, "no_backend")
	case admission.ReasonQueueFull, admission.ReasonQueueTimeout, admission.ReasonOverloaded:
		msg := map[string]string{
			admission.ReasonQueueFull:    "The admission queue is full.",
			admission.ReasonQueueTimeout: "The request could not be admitted within its queue deadline.",
			admission.ReasonOverloaded:   "The GPU is under memory pressure and this request's priority class is being shed.",
		}[reason]
		if field := x.rt.cfg.queueingOff(x.class); reason == admission.ReasonQueueFull && field != "" {
			msg = fmt.Sprintf("No GPU serving model `%s` has room for this request now, and queueing is disabled (%s is negative).", x.req.model, field)
		}
		x.fail(ctx, &apiError{status: 429, typ: typeRateLimit, code: reason, retryAfter: rej.RetryAfter,
			message: fmt.Sprintf("%s It needs %s of KV cache; retry after %s.", msg, kvbudget.FormatBytes(x.res.weight()), retryAfterText(rej.RetryAfter))},
			outcomeShed, reason)
	default:
		x.fail(ctx, &apiError{status: 500, typ: typeServer, message: err.Error()}, outcomeFailed, "internal")
	}
}

// renameModel gives the client back the model name it sent (served_name)
// where the backend's answer names its own: the "model" member of a body
// or of a stream's event. A member's quotes in a JSON string value would be
// escaped, so the pattern cannot match inside the generated text. Without
// an alias it returns b as it is, allocating nothing.
func (x *exchange) renameModel(b []byte) []byte {
	if x.alias == "" {
		return b
	}
	if x.renames == nil {
		from, to := jsonscan.AppendString(nil, x.req.model), jsonscan.AppendString(nil, x.alias)
		for _, sep := range []string{`"model":`, `"model": `} {
			x.renames = append(x.renames, [2][]byte{append([]byte(sep), from...), append([]byte(sep), to...)})
		}
	}
	for _, r := range x.renames {
		b = bytes.ReplaceAll(b, r[0], r[1])
	}
	return b
}

// forwardedHeaders are the client's headers a backend is sent besides the
// body's type: what ties its work to the client's request and trace.
var forwardedHeaders = [...]string{"Accept", "X-Request-Id", "Traceparent", "Tracestate"}

// lowerHint is how a request too large to admit can be made smaller. One
// that sets no length (LangChain and the AI SDK omit it by default) is told
// that this is why: without max_tokens the whole remaining context is
// reserved for its output.
func (x *exchange) lowerHint() string {
	if x.req.maxTokens == 0 && x.injectMax == 0 {
		return fmt.Sprintf("Set max_tokens or max_completion_tokens: without it the whole remaining context, %d tokens, is reserved for the output.", x.res.maxOut())
	}
	return "Lower max_tokens or n, or shorten the prompt."
}

// forward sends the request to a backend of the GPU its ticket is bound
// to. On a transport failure it tries another backend of that GPU (whose
// pool the ticket already holds), and once, when there is none, moves the
// ticket to another GPU and tries there: nothing has reached the client
// yet, so a retry is safe, and the reservation moves rather than doubles.
func (x *exchange) forward(ctx *fasthttp.RequestCtx) (*backends.Response, error) {
	body := ctx.PostBody()
	if usage := x.req.stream && !x.req.includeUsage; usage || x.injectMax > 0 || x.req.dropMaxCompletion || x.alias != "" {
		model := ""
		if x.alias != "" {
			model = x.req.model
		}
		b, err := rewriteBody(body, usage, x.injectMax, x.req.dropMaxCompletion, model)
		if err != nil {
			return nil, fmt.Errorf("rewrite body: %w", err)
		}
		body = b
	}
	ureq := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(ureq)
	tried := map[*backends.Backend]bool{}
	moved := false
	lastErr := errNoBackendOnGPU
	for {
		var be *backends.Backend
		if g := x.group(x.ticket.Pool()); g != nil {
			be = g.backendFor(x.req.model, tried)
		}
		if be == nil {
			if moved || x.ctx.Err() != nil {
				return nil, lastErr
			}
			moved = true
			x.rt.syncRoutes() // the failure may have opened a circuit: bind elsewhere
			if err := x.ticket.Move(x.ctx); err != nil {
				return nil, fmt.Errorf("%w (and no other GPU could take the request: %v)", lastErr, err)
			}
			x.s.log.Warn("backend failed before answering; moved the request to another GPU", "model", x.req.model, "gpu", x.ticket.Pool(), "err", lastErr)
			continue
		}
		tried[be] = true
		x.armFirstByte(be) // on the first backend tried
		be.NewRequest(ureq, fasthttp.MethodPost, x.req.kind.path())
		ureq.Header.SetContentType("application/json")
		// The request id and W3C trace context reach the backend: vLLM
		// started with --otlp-traces-endpoint continues the client's trace.
		for _, h := range forwardedHeaders {
			if v := ctx.Request.Header.Peek(h); len(v) > 0 {
				ureq.Header.SetBytesV(h, v)
			}
		}
		ureq.SetBodyRaw(body)
		x.backend = be // the backend waited on, for a first-byte timeout
		resp, err := be.Do(x.ctx, ureq)
		if err == nil {
			return resp, nil
		}
		if x.ctx.Err() != nil {
			return nil, err
		}
		x.s.m.upstreamErrors.WithLabelValues(be.Name(), "transport").Inc()
		x.s.log.Warn("backend failed before answering", "backend", be.Name(), "err", err)
		lastErr = err
	}
}

// group is the GPU of an admission pool. The scheduler binds a queued
// request to any pool it knows, and a reload may have added that pool after
// the request loaded its runtime: then only the current runtime has its
// GPU. nil if neither has (a later reload removed it again).
func (x *exchange) group(pool string) *group {
	if g := x.rt.poolGroup[pool]; g != nil {
		return g
	}
	return x.s.rt.Load().poolGroup[pool]
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
		x.upstreamFailed(ctx, err)
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

// learnWhole teaches the model's output-length predictor what a
// non-streamed answer generated: only a single choice's length is known
// (usage counts all choices together).
func (x *exchange) learnWhole(v *fastjson.Value) {
	choices := v.GetArray("choices")
	if !x.hasUsage || len(choices) != 1 || len(x.res.prompts) != 1 {
		return
	}
	if fr := choices[0].Get("finish_reason"); fr != nil && fr.Type() == fastjson.TypeString {
		if prompt, n, ok := x.res.finish(0, x.usage.completion); ok {
			x.ticket.Done(prompt, n, string(fr.GetStringBytes()) == "length")
		}
	}
}

func (x *exchange) readUsage(u *fastjson.Value) {
	if u == nil || u.Type() != fastjson.TypeObject {
		return
	}
	x.usage.prompt, x.usage.completion = u.GetInt("prompt_tokens"), u.GetInt("completion_tokens")
	x.hasUsage = true
}

// recordUsage compares what was reserved with what the backend reports, and
// calibrates the estimate tokenizer against it.
func (x *exchange) recordUsage() {
	ms := x.s.m.forModel(x.m.name)
	ts := x.s.m.forTenant(x.m.name, x.tenant)
	ts.predicted[0].Add(float64(x.predicted))
	ts.actual[0].Add(float64(x.usage.prompt))
	ts.predicted[1].Add(float64(x.res.reservedOutput()))
	ts.actual[1].Add(float64(x.usage.completion))
	if x.ticket != nil {
		ms.outPredicted.Add(float64(x.ticket.PredictedOutput()))
		ms.outGenerated.Add(float64(x.usage.completion))
	}
	if x.predicted > 0 && x.usage.prompt > 0 {
		source := x.source
		if source == "" {
			source = x.m.tokenizer
		}
		ms.ratio[source].Observe(float64(x.usage.prompt) / float64(x.predicted))
	}
	x.checkCached()
	if len(x.req.shapes) == 1 && !x.req.shapes[0].ids && x.usage.prompt > 0 {
		x.m.est.observe(x.req.shapes[0], x.usage.prompt)
	}
}

// relay streams SSE events from the backend to the client as they arrive,
// starting with first (already read, to honour the first-byte timeout
// before the client was promised a 200): each event is flushed as soon as
// no further bytes are already buffered (so a burst goes out in one write,
// and a lone token at once). It counts tokens and finished choices on the
// way, returns each finished choice's KV at once, and drops the usage chunk
// the gateway asked for on the client's behalf.
//
// How the stream ends decides the outcome: [DONE] relayed is a success,
// whatever the client does after it; a stream that ends without [DONE],
// breaks, or sends an event past the size bound gets a final error event
// on its own line and is a failure. It runs after the handler has
// returned, while fasthttp writes the body (see sseBody), and must not
// touch the RequestCtx.
func (x *exchange) relay(w *bufio.Writer, resp *backends.Response, er *eventReader, first []byte) {
	outcome, reason := outcomeOK, ""
	done := false // [DONE] reached the client: nothing after changes the outcome
	defer func() {
		if p := recover(); p != nil {
			x.s.log.Error("panic relaying stream", "panic", p, "stack", string(debug.Stack()))
			outcome, reason = outcomeFailed, "internal"
		}
		er.release()
		resp.Release()
		x.finish(outcome, reason)
	}()
	p := x.s.parsers.Get()
	defer x.s.parsers.Put(p)
	var shape tokenShape

	ev, err := first, error(nil)
	for ; err == nil; ev, err = er.next() {
		keep, failed, last := x.inspect(p, &shape, ev)
		if failed && !done {
			outcome, reason = outcomeFailed, "backend_stream_error"
		}
		if keep && !done {
			if _, werr := w.Write(x.renameModel(ev)); werr != nil {
				x.clientGone()
				outcome, reason = outcomeCanceled, "client_disconnect"
				return
			}
		}
		if !done && !er.buffered() || last {
			if ferr := w.Flush(); ferr != nil && !done {
				x.clientGone()
				outcome, reason = outcomeCanceled, "client_disconnect"
				return
			}
			if last && !done {
				done = true
				x.relayedDone()
				// The backend has finished: its blocks are free already,
				// even if its side of the stream stays open a moment.
				x.ticket.Release()
			}
		}
	}
	if done {
		return // reading on was only to reuse the connection
	}
	// The stream ended without [DONE]: the client gets a final error event.
	if o, r, e := x.ended(); o != "" {
		outcome, reason = o, r
		if e != nil {
			writeStreamError(w, e)
		}
		return
	}
	name := x.backend.Name()
	switch {
	case errors.Is(err, errEventTooLarge):
		outcome, reason = outcomeFailed, "upstream_event_too_large"
	case errors.Is(err, io.EOF), errors.Is(err, errStreamTruncated):
		outcome, reason = outcomeFailed, "upstream_incomplete"
		err = errStreamTruncated
	default:
		outcome, reason = outcomeFailed, "upstream_error"
	}
	x.s.m.upstreamErrors.WithLabelValues(name, "transport").Inc()
	x.s.log.Warn("backend stream ended badly", "backend", name, "err", err)
	writeStreamError(w, &apiError{typ: typeServer, code: "upstream_error", message: upstreamProblem(name, err)})
}

func (x *exchange) clientGone() { x.rctx.cancel(errClientGone) }

// StopForMemory is the admission guard stopping the request (see
// admission's guard.go): its context ends, which closes the upstream
// exchange and lingers its reservation until the backend has let the
// blocks go; the relay then ends the stream with an error event.
func (x *exchange) StopForMemory() { x.rctx.cancel(errStoppedForMemory) }

var _ admission.Stopper = (*exchange)(nil)

// outOfMemory is what the error of a backend that ran out of KV blocks
// says (PyTorch's "CUDA out of memory", the simulator's too).
var outOfMemory = []byte("out of memory")

// overflowed tells admission that the request's GPU ran out of memory:
// every forecast made for it is distrusted for the cool-down.
func (x *exchange) overflowed() {
	if x.ticket == nil || x.rt.count {
		return
	}
	pool := x.ticket.Pool()
	x.rt.sched.Overflowed(pool)
	gpu := pool
	if g := x.rt.poolGroup[pool]; g != nil {
		gpu = g.name
	}
	x.s.m.overflows.WithLabelValues(gpu).Inc()
	x.s.log.Warn("a backend ran out of KV memory: the GPU goes to worst-case admission for the cool-down", "gpu", gpu, "backend", x.backend.Name())
}

// The stages of an exchange, as hangUp reads them.
const (
	stageBefore int32 = iota // no stream under way
	stageStreaming
	stageDone // [DONE] reached the client
)

// hangUp is the watch's report that the client hung up — or only shut its
// sending side: the kernel tells the two apart only once we write. While a
// stream is under way the relay's writes tell, within an event or two, so
// the report is kept for later rather than cutting off a client that still
// reads (HTTP/1.1 allows a half-close); once [DONE] has gone out nothing is
// written any more, and the report ends the request, as it does before the
// stream. Each side writes its own flag before it reads the other's, so a
// report that races [DONE] is acted on by one of them.
func (x *exchange) hangUp() {
	if x.stage.Load() != stageStreaming {
		x.clientGone()
		return
	}
	x.hungUp.Store(true)
	if x.stage.Load() != stageStreaming {
		x.clientGone()
	}
}

// relayedDone marks [DONE] as relayed, and ends the request if the client
// was reported gone during the stream.
func (x *exchange) relayedDone() {
	x.stage.Store(stageDone)
	if x.hungUp.Load() {
		x.clientGone()
	}
}

// writeStreamError ends a stream that has already begun with an error event,
// the way vLLM reports errors mid-stream. Every event before it ended with
// its blank line, so the error stands on its own line.
func writeStreamError(w *bufio.Writer, e *apiError) {
	w.WriteString("data: ")
	w.Write(e.appendJSON(nil, false))
	w.WriteString("\n\ndata: [DONE]\n\n")
	w.Flush()
}

// inspect reads one SSE event: token counts, finished choices, usage,
// errors. keep is false for the usage-only chunk the client did not ask for;
// last says the event is the stream's terminator, [DONE]. shape is the
// stream's, to tell its token events by.
func (x *exchange) inspect(p *fastjson.Parser, shape *tokenShape, ev []byte) (keep, failed, last bool) {
	data := sseData(ev)
	if data == nil {
		return true, false, false
	}
	if string(data) == "[DONE]" {
		return true, false, true
	}
	if len(x.res.gen) == 1 {
		// About the only choice and nothing else: read without a parse.
		if c, ok := shape.choice0(data); ok {
			if c.text {
				x.token(0)
			}
			if c.finish != nil {
				x.finished(0, string(c.finish) == "length")
			}
			return true, false, false
		}
	}
	v, err := p.ParseBytes(data)
	if err != nil {
		return true, false, false
	}
	if e := v.Get("error"); e != nil {
		if bytes.Contains(e.GetStringBytes("message"), outOfMemory) {
			x.overflowed()
		}
		return true, true, false
	}
	if u := v.Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
		x.readUsage(u)
	}
	choices := v.GetArray("choices")
	for _, c := range choices {
		idx := c.GetInt("index")
		if generated(c) {
			x.token(idx)
		}
		if fr := c.Get("finish_reason"); fr != nil && fr.Type() == fastjson.TypeString {
			x.finished(idx, string(fr.GetStringBytes()) == "length")
		}
	}
	if len(choices) == 0 && x.hasUsage && !x.req.includeUsage {
		return false, false, false
	}
	return true, false, false
}

// generated says whether a streamed choice carries what its sequence
// generated, which the relay counts as a token: a completion's text, or in
// a chat's delta the content, the reasoning of a reasoning model (vLLM's
// "reasoning", formerly "reasoning_content") or a piece of a tool call.
// Each is output the backend holds KV blocks for; a stream that counted
// only content would report no progress while a model reasons or calls a
// tool, and its reservation would fall behind what it holds.
func generated(c *fastjson.Value) bool {
	if len(c.GetStringBytes("text")) > 0 {
		return true
	}
	d := c.Get("delta")
	if d == nil {
		return false
	}
	for _, k := range generatedKeys {
		if len(d.GetStringBytes(k)) > 0 {
			return true
		}
	}
	return len(d.GetArray("tool_calls")) > 0
}

var generatedKeys = [...]string{"content", "reasoning", "reasoning_content"}

// token counts one token of choice idx.
func (x *exchange) token(idx int) {
	x.firstToken()
	if idx == 0 {
		x.interToken()
	}
	if prompt, furthest, moved := x.res.token(idx); moved {
		x.ticket.Progress(prompt, furthest)
	}
}

// finished notes that choice idx finished, by its length cap or not: its
// blocks go back at once.
func (x *exchange) finished(idx int, capped bool) {
	if prompt, n, ok := x.res.finish(idx, -1); ok {
		x.ticket.Done(prompt, n, capped)
	}
}

// firstToken observes the time to the first token, once per request.
func (x *exchange) firstToken() {
	if !x.firstTok {
		x.firstTok = true
		x.access.ttft = x.s.now().Sub(x.start)
		x.s.m.forModel(x.m.name).ttft.Observe(x.access.ttft.Seconds())
	}
}

// interToken observes the time since the first choice's previous token:
// one sequence's pace, which the other choices of the request share (a
// backend steps every running sequence together).
func (x *exchange) interToken() {
	now := x.s.now()
	if !x.lastTok.IsZero() {
		x.s.m.forModel(x.m.name).itl.Observe(now.Sub(x.lastTok).Seconds())
	}
	x.lastTok = now
}

// sseData is the payload of an event's data line(s); nil for comments and
// events without data.
func sseData(ev []byte) []byte {
	var out []byte
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		line = bytes.TrimRight(line, "\r")
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			d = bytes.TrimPrefix(d, []byte(" "))
			if out != nil {
				out = append(append(append([]byte(nil), out...), '\n'), d...)
			} else {
				out = d
			}
		}
	}
	return out
}
