package gateway

import (
	"errors"
	"io"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/sse"
)

// The loop: arrival → count → admit → forward → answer. An admitted
// request's handler (serveAdmitted) reads and counts it, reserves, and
// takes the loop's first turn: admission, the sending, the answer's first
// event (turn). A whole answer is passed on; a stream is relayed
// (stream, relay.go), and a stream the guard stopped to resume it takes
// another turn of the same steps, from the relay's goroutine, with the
// continuation (resume.go). Whichever turn fails, its error becomes the
// client's answer in one place (failure): an HTTP error before the
// stream, an error event in it.

// serveAdmitted serves a request of an admitted API: the loop's steps,
// each as its API's entry in the table of routes (routes.go) says, and
// its first turn.
func (s *Server) serveAdmitted(ctx *fasthttp.RequestCtx, kind endpoint) {
	if s.testHookServe != nil {
		s.testHookServe()
	}
	a := &apis[kind]
	x := s.begin(ctx, kind)
	defer x.leave()

	tn, ok := x.readBody(ctx, kind, a.parse)
	if !ok {
		return
	}
	texts := a.texts
	if a.typed && x.m.converted.Load() {
		texts = nil // its backend counts them above their chat: estimated (tally.go)
	}
	prompts, exact, ok := x.count(ctx, tn, texts)
	if !ok || !a.reserve(x, ctx, prompts, exact) {
		return
	}
	areq := a.admission(x)
	if x.rt.cfg.Routing == routingAffinity {
		areq.Affinity = x.affinity(ctx)
	}
	body, err := x.outgoing(ctx)
	if err != nil {
		x.refuse(ctx, err)
		return
	}
	up, err := x.turn(areq, body, &ctx.Request.Header)
	x.turnHeaders(ctx)
	if err != nil {
		x.refuse(ctx, err)
		return
	}
	x.answer(ctx, up)
}

// The steps before the first turn, in order: read the body and find its
// model (readBody), find its class and count its prompts (count), reserve
// (the API's own). Each answers the client and finishes the exchange
// itself when it fails, and says so by returning false.

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
		req.alias, req.model = req.model, m.name
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

// upstream is a turn's answer from the backend: the response and, for a
// stream, its reader and first event.
type upstream struct {
	resp  *backends.Response
	er    *sse.Reader // nil: a whole answer
	first []byte
}

// release gives the response back; the upstream is empty after.
func (u *upstream) release() {
	if u.er != nil {
		u.er.Release()
	}
	if u.resp != nil {
		u.resp.Release()
	}
	*u = upstream{}
}

// refusal is admission's answer, when it is not a ticket.
type refusal struct{ err error }

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// turn admits the request as areq says, sends it (body, with hdr's
// forwarded headers) and reads its answer's first event when the answer
// is a stream: the steps of every sending of a request, the first and a
// stopped stream's continuation alike.
func (x *exchange) turn(areq admission.Request, body []byte, hdr headerSource) (upstream, error) {
	for {
		up, err := x.turnOnce(areq, body, hdr)
		if err == nil || x.rctx.Err() != nil || !x.rctx.stopped() {
			return up, err
		}
		areq = x.resendBeforeAnswer()
	}
}

// resendBeforeAnswer is how a request the guard stopped to resume it
// goes on when it was stopped before its answer began: nothing was
// generated and nothing reached the client, so it is sent again as it
// was, held at its worst case with no Stopper (never stopped twice) at
// the stopped request's place in the queue, which lingers until the
// backend has let its blocks go. Without it the cut exchange was a
// backend's failure: a 502 for a stream that was to be resumed.
func (x *exchange) resendBeforeAnswer() admission.Request {
	x.stopFirstByte() // its clock restarts with the next sending
	if rs := x.resume; rs != nil {
		rs.resumed = true
		rs.lost.Store(true)
	}
	stopped := x.ticket
	x.ticket = nil
	return admission.Request{Pinned: true, Resumes: stopped}
}

// turnOnce is one sending of turn's.
func (x *exchange) turnOnce(areq admission.Request, body []byte, hdr headerSource) (upstream, error) {
	if err := x.admit(areq); err != nil {
		return upstream{}, &refusal{err}
	}
	resp, err := x.send(body, hdr)
	if err != nil {
		return upstream{}, err
	}
	if resp.Status() != fasthttp.StatusOK || !x.req.stream || !resp.IsEventStream() {
		x.answered()
		return upstream{resp: resp}, nil
	}
	// The client is promised a 200 for a stream only once its first
	// event is here: until then a backend that hangs can still get a 504.
	er := sse.NewReader(resp, x.rt.cfg.Server.MaxSSELineBytes.Bytes)
	first, err := er.Next()
	if err != nil {
		er.Release()
		resp.Release()
		if errors.Is(err, io.EOF) {
			err = sse.ErrTruncated
		}
		return upstream{}, err
	}
	x.answered()
	return upstream{resp: resp, er: er, first: first}, nil
}

// admit waits for the request's admission. areq says how the request
// runs (Opaque, Pinned, Stopper, Affinity, Resumes); admit fills in what
// every request is admitted by. The queue wait ends at the class's timeout
// or when the request as a whole would time out, whichever is first; the
// scheduler sheds at once a request whose expected wait already passes
// that.
func (x *exchange) admit(areq admission.Request) error {
	rt := x.rt
	areq.Queue, areq.Class, areq.Tenant = x.req.model, x.class, x.tenant
	areq.Deadline = x.rctx.deadline
	if rt.count {
		areq.Weight = 1
	} else {
		areq.Shape = x.res.shape()
	}
	t := &x.ticketBuf // in the exchange: an admission that fits at once allocates nothing
	if areq.Resumes != nil {
		// The stopped ticket, ticketBuf, lingers until the backend has
		// let its blocks go.
		t = new(admission.Ticket)
	}
	x.s.flights.admitting(x)
	err := rt.sched.AcquireTicket(&x.rctx, areq, t)
	x.s.flights.admitted(x)
	x.trace.admitted(x)
	if err != nil {
		return err
	}
	x.ticket = t
	x.rctx.releaseOnEnd(t)
	if areq.Resumes != nil {
		x.s.m.resumed.WithLabelValues(x.m.name).Inc()
	}
	return nil
}

// failure is what a turn's error tells the client, and the request's
// outcome: the request's own end when its context ended (e nil when
// nobody is left to tell), admission's refusal, else the backend's
// failure — a 504 when its first byte was late (a timeout its circuit
// counts), a 502 naming the backend otherwise.
func (x *exchange) failure(err error) (e *apiError, outcome, reason string) {
	if ref := (*refusal)(nil); errors.As(err, &ref) {
		if admission.ReasonOf(ref.err) != admission.ReasonCanceled {
			return x.admissionError(ref.err)
		}
		if outcome, reason, e = x.ended(); outcome != "" {
			return e, outcome, reason
		}
		return nil, outcomeCanceled, "client_disconnect"
	}
	x.stopFirstByte()
	if errors.Is(x.rctx.Cause(), errFirstByteTimeout) && x.backend != nil {
		if x.backend.ReportTimeout(errFirstByteTimeout) {
			x.s.backendLog.observe(x.backend, "consecutive first-byte timeouts")
		}
	}
	if outcome, reason, e = x.ended(); outcome != "" {
		return e, outcome, reason
	}
	return x.s.upstreamError(x.backendName(), err), outcomeFailed, "upstream_error"
}

// refuse answers a request whose turn failed before its answer began,
// and finishes it.
func (x *exchange) refuse(ctx *fasthttp.RequestCtx, err error) {
	e, outcome, reason := x.failure(err)
	x.fail(ctx, e, outcome, reason)
}

// upstreamError counts and logs a failure talking to a backend, and is
// its 502: naming the backend, never its address, which goes to the log.
func (s *Server) upstreamError(backend string, err error) *apiError {
	s.m.upstreamErrors.WithLabelValues(backend, "transport").Inc()
	s.log.Warn("backend failed", "backend", backend, "err", err)
	return &apiError{status: 502, typ: typeServer, code: "upstream_error", message: upstreamProblem(backend, err)}
}

// turnHeaders tell the client how long its request waited for admission
// and which backend it was sent to, whether the turn succeeded or not.
func (x *exchange) turnHeaders(ctx *fasthttp.RequestCtx) {
	if x.ticket == nil {
		return
	}
	if w := x.ticket.Waited(); w > 0 {
		ctx.Response.Header.Set("X-Kvgate-Queue-Ms", strconv.FormatInt(w.Milliseconds(), 10))
	}
	if x.backend != nil {
		ctx.Response.Header.Set("X-Kvgate-Backend", x.backend.Name())
	}
}
