package gateway

import (
	"errors"
	"io"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
)

// The steps every admitted route takes, in order: read the body and find
// its model (readBody), find its class and count its prompts (count),
// reserve (the route's own), wait for admission (admit), and forward
// (upstream). Each answers the client and finishes the exchange itself
// when it fails, and says so by returning false.

// begin starts a proxied request's exchange; the caller defers leave.
func (s *Server) begin(ctx *fasthttp.RequestCtx, kind endpoint) *exchange {
	x := s.newExchange(ctx, s.rt.Load())
	x.noteAccess(ctx, kind.path())
	x.startTrace(ctx, kind)
	return x
}

// leave finishes an exchange a path forgot to finish — a no-op for every
// path that did — unless a stream's relay owns its finish now.
func (x *exchange) leave() {
	if !x.streaming {
		x.finish(outcomeFailed, "internal")
	}
}

// readBody authenticates the client, reads the body and finds the model
// it names: a served_name becomes the backend's model name from here on,
// the client's name going back into the body forwarded and the answers.
func (x *exchange) readBody(ctx *fasthttp.RequestCtx, kind endpoint, parse parseFunc) (*tenant, bool) {
	rt := x.rt
	tn, ok := rt.authenticate(ctx)
	if !ok {
		x.fail(ctx, unauthorized(), outcomeRejected, "unauthorized")
		return nil, false
	}
	if tn != nil {
		x.tenant = tn.name
	}
	p := x.s.parsers.Get()
	req, err := parse(p, ctx.PostBody(), kind)
	x.s.parsers.Put(p)
	if err != nil {
		var pe *parseError
		errors.As(err, &pe)
		x.fail(ctx, &apiError{status: 400, typ: typeInvalidRequest, param: pe.param, message: pe.msg}, outcomeRejected, "invalid_request")
		return nil, false
	}
	x.req = req
	m := rt.byClientName[req.model]
	if m == nil {
		x.fail(ctx, unknownModel(req.model), outcomeRejected, "unknown_model")
		return nil, false
	}
	if m.servedName != m.name {
		x.alias, req.model = req.model, m.name
	}
	x.m, x.label = m, m.name
	return tn, true
}

// count finds the request's class and counts its prompts; texts finds
// the prompts' text in the body for a model counted by its backend.
func (x *exchange) count(ctx *fasthttp.RequestCtx, tn *tenant, texts textsFunc) (prompts []int, exact []bool, ok bool) {
	rt, req := x.rt, x.req
	if e := req.outOfRange(x.m.maxLen); e != nil {
		x.fail(ctx, e, outcomeRejected, "invalid_request")
		return nil, nil, false
	}
	if x.m.tokenizer == "backend" && texts != nil {
		if err := texts(&x.s.parsers, ctx.PostBody(), req); err != nil {
			x.s.log.Error("find the prompts of a parsed request", "err", err)
			x.fail(ctx, internalError(), outcomeFailed, "internal")
			return nil, nil, false
		}
	}
	var err error
	if x.class, err = rt.classFor(tn, ctx.Request.Header.Peek(rt.cfg.Admission.PriorityHeader)); err != nil {
		x.fail(ctx, &apiError{status: 400, typ: typeInvalidRequest, param: rt.cfg.Admission.PriorityHeader, message: err.Error()}, outcomeRejected, "invalid_request")
		return nil, nil, false
	}
	if !rt.upstreams.Serves(req.model) {
		x.fail(ctx, noBackend(req.model), outcomeFailed, "no_backend")
		return nil, nil, false
	}
	prompts, exact, err = x.countPrompts()
	if errors.Is(err, backends.ErrNoBackend) {
		x.fail(ctx, noBackend(req.model), outcomeFailed, "no_backend")
		return nil, nil, false
	}
	if err != nil {
		if !x.failEnded(ctx) {
			x.fail(ctx, internalError(), outcomeFailed, "internal")
		}
		return nil, nil, false
	}
	return prompts, exact, true
}

// reserved fails the request with its reservation's refusal, if it has
// one.
func (x *exchange) reserved(ctx *fasthttp.RequestCtx, e *apiError) bool {
	if e != nil {
		x.fail(ctx, e, outcomeRejected, e.code)
		return false
	}
	return true
}

// admit waits for the request's admission. areq says how the request
// runs (Opaque, Pinned, Stopper); admit fills in what every request is
// admitted by. The queue wait ends at the class's timeout or when the
// request as a whole would time out, whichever is first; the scheduler
// sheds at once a request whose expected wait already passes that.
func (x *exchange) admit(ctx *fasthttp.RequestCtx, areq admission.Request) bool {
	rt := x.rt
	areq.Queue, areq.Class, areq.Tenant = x.req.model, x.class, x.tenant
	areq.Deadline = x.start.Add(rt.cfg.Server.requestTimeout())
	if rt.count {
		areq.Weight = 1
	} else {
		areq.Shape = x.res.shape()
	}
	if rt.cfg.Routing == routingAffinity {
		areq.Affinity = x.affinity(ctx)
	}
	x.s.flights.admitting(x)
	err := rt.sched.AcquireTicket(x.ctx, areq, &x.ticketBuf)
	x.s.flights.admitted(x)
	x.trace.admitted(x)
	if err != nil {
		x.admissionFailed(ctx, err)
		return false
	}
	x.ticket = &x.ticketBuf
	x.rctx.releaseOnEnd(x.ticket)
	if w := x.ticket.Waited(); w > 0 {
		ctx.Response.Header.Set("X-Kvgate-Queue-Ms", strconv.FormatInt(w.Milliseconds(), 10))
	}
	return true
}

// upstream forwards the admitted request and passes the backend's
// headers on.
func (x *exchange) upstream(ctx *fasthttp.RequestCtx) (*backends.Response, bool) {
	resp, err := x.forward(ctx)
	if err != nil {
		x.upstreamFailed(ctx, err)
		return nil, false
	}
	ctx.Response.Header.Set("X-Kvgate-Backend", x.backend.Name())
	copyBackendHeaders(ctx, resp)
	return resp, true
}

// answer answers the client from the backend's response: a streamed
// answer is relayed (the relay then owns the exchange's finish), any other
// passed whole. The client is promised a 200 for a stream
// only once its first event is here: until then a backend that hangs can
// still get a 504.
func (x *exchange) answer(ctx *fasthttp.RequestCtx, resp *backends.Response) {
	if resp.Status() != fasthttp.StatusOK || !x.req.stream || !resp.IsEventStream() {
		x.answered()
		x.passBody(ctx, resp)
		return
	}
	er := newEventReader(resp, x.rt.cfg.Server.MaxSSELineBytes.Bytes)
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
	x.streaming = true            // from here the relay owns finish
	x.stage.Store(stageStreaming) // see hangUp
	x.body = sseBody{x: x, resp: resp, er: er, first: first}
	if !ctx.Request.Header.IsHTTP11() {
		x.body.closeDelimited(ctx, x.rt.cfg.Server.writeTimeout())
		return
	}
	ctx.Response.SetBodyStream(&x.body, -1)
}
