package gateway

import (
	"errors"

	"github.com/valyala/fasthttp"

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
