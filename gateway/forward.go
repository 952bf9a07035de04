package gateway

import (
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/backends"
)

// outgoing is the body the backend is sent: the client's, rewritten
// where the gateway asks for more or renames the model. A stream that
// may be resumed keeps it, with the headers forwarded: its continuation
// is sent after the handler has returned.
func (x *exchange) outgoing(ctx *fasthttp.RequestCtx) ([]byte, error) {
	body := ctx.PostBody()
	// A streamed chat or completion asks for the usage at its end and on
	// every chunk; send takes the latter off for a backend that refuses it.
	if ask := x.usageAsk(); ask != askAsSent || x.injectMax > 0 || x.req.dropMaxCompletion || x.req.alias != "" {
		model := ""
		if x.req.alias != "" {
			model = x.req.model
		}
		b, err := rewriteBody(body, ask, x.injectMax, x.req.dropMaxCompletion, model)
		if err != nil {
			return nil, fmt.Errorf("rewrite body: %w", err)
		}
		body = b
	}
	if x.resume != nil {
		x.resume.keep(body, &ctx.Request.Header)
	}
	return body, nil
}

// usageAsk is the usage a streamed chat or completion asks its backend
// for on the client's behalf: on every chunk (the relay strips what the
// client did not ask for), unless the client asked for that itself.
func (x *exchange) usageAsk() usageAsk {
	if x.req.stream && !x.req.kind.typedEvents() && !x.req.continuousUsage {
		return askContinuous
	}
	return askAsSent
}

// headerSource is where the headers a backend is sent come from: the
// client's request, or a resumed stream's copy of them.
type headerSource interface{ Peek(key string) []byte }

// send sends the request to a backend of the GPU its ticket is bound
// to. On a transport failure it tries another backend of that GPU (whose
// pool the ticket already holds), and once, when there is none, moves the
// ticket to another GPU and tries there: nothing has reached the client
// yet, so a retry is safe, and the reservation moves rather than doubles.
func (x *exchange) send(body []byte, hdr headerSource) (*backends.Response, error) {
	ureq := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(ureq)
	tried := map[*backends.Backend]bool{}
	moved := false
	var finalOnly []byte // body as a backend that refuses continuous usage takes it

	lastErr := errNoBackendOnGPU
	for {
		var be *backends.Backend
		if g := x.gpu(x.ticket.GPU()); g != nil {
			be = g.backendFor(x.req.model, tried)
		}
		if be == nil {
			if moved || x.rctx.Err() != nil {
				return nil, lastErr
			}
			moved = true
			x.rt.syncRoutes() // the failure may have opened a circuit: bind elsewhere
			if err := x.ticket.Move(&x.rctx); err != nil {
				return nil, fmt.Errorf("%w (and no other GPU could take the request: %v)", lastErr, err)
			}
			x.s.log.Warn("backend failed before answering; moved the request to another GPU", "model", x.req.model, "gpu", x.ticket.GPU(), "err", lastErr)
			continue
		}
		tried[be] = true
		x.armFirstByte(be) // on the first backend tried
		be.NewRequest(ureq, fasthttp.MethodPost, x.req.kind.path())
		ureq.Header.SetContentType("application/json")
		copyForwarded(&ureq.Header, hdr)
		x.trace.upstream(x, ureq, be) // its traceparent replaces the client's
		if be.FinalUsageOnly() && x.usageAsk() == askContinuous {
			if finalOnly == nil {
				b, err := rewriteBody(body, askFinal, 0, false, "")
				if err != nil {
					return nil, fmt.Errorf("rewrite body: %w", err)
				}
				finalOnly = b
			}
			ureq.SetBodyRaw(finalOnly)
		} else {
			ureq.SetBodyRaw(body)
		}
		x.backend = be // the backend waited on, for a first-byte timeout
		x.access.attempts++
		x.access.sentAt = x.s.now()
		resp, err := be.Do(&x.rctx, ureq)
		if err == nil {
			return resp, nil
		}
		if x.rctx.Err() != nil || x.rctx.cutToResume() {
			return nil, err // ended, or the guard's cut: not the backend's failure
		}
		x.s.m.upstreamErrors.WithLabelValues(be.Name(), "transport").Inc()
		x.s.log.Warn("backend failed before answering", "backend", be.Name(), "err", err)
		lastErr = err
	}
}

// forwardedHeaders are the client's headers a backend is sent besides the
// body's type: what ties its work to the client's request and trace.
var forwardedHeaders = [...]string{"Accept", "X-Request-Id", "Traceparent", "Tracestate"}

// copyForwarded copies the forwarded headers: the request id and W3C
// trace context reach the backend, and vLLM started with
// --otlp-traces-endpoint continues the client's trace.
func copyForwarded(dst *fasthttp.RequestHeader, hdr headerSource) {
	for _, h := range forwardedHeaders {
		if v := hdr.Peek(h); len(v) > 0 {
			dst.SetBytesV(h, v)
		}
	}
}

// errNoBackendOnGPU is forward's error when the GPU a request is bound to
// has no backend left to try.
var errNoBackendOnGPU = errors.New("no available backend on the GPU the request was bound to")

// gpu is the GPU of a budget's id. The scheduler binds a queued
// request to any GPU it knows, and a reload may have added that GPU after
// the request loaded its runtime: then only the current runtime has its
// GPU. nil if neither has (a later reload removed it again).
func (x *exchange) gpu(id string) *gpu {
	if g := x.rt.gpuByID[id]; g != nil {
		return g
	}
	return x.s.rt.Load().gpuByID[id]
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
	x.trace.answered(x)
	if !x.stopFirstByte() {
		return
	}
	x.backend.ReportAnswered()
}
