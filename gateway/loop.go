package gateway

import (
	"errors"
	"io"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
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

// upstream is a turn's answer from the backend: the response and, for a
// stream, its reader and first event.
type upstream struct {
	resp  *backends.Response
	er    *eventReader // nil: a whole answer
	first []byte
}

// release gives the response back; the upstream is empty after.
func (u *upstream) release() {
	if u.er != nil {
		u.er.release()
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
	er := newEventReader(resp, x.rt.cfg.Server.MaxSSELineBytes.Bytes)
	first, err := er.next()
	if err != nil {
		er.release()
		resp.Release()
		if errors.Is(err, io.EOF) {
			err = errStreamTruncated
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
	err := rt.sched.AcquireTicket(x.ctx, areq, t)
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

// queueHeader tells the client how long its request waited for admission.
func (x *exchange) queueHeader(ctx *fasthttp.RequestCtx) {
	if x.ticket == nil {
		return
	}
	if w := x.ticket.Waited(); w > 0 {
		ctx.Response.Header.Set("X-Kvgate-Queue-Ms", strconv.FormatInt(w.Milliseconds(), 10))
	}
}
