package gateway

import (
	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/backends"
)

// The routes that reserve nothing — /tokenize (tokenize.go) and the
// routes passed through (passthrough.go) — take the admitted routes'
// first and last steps, and nothing between: the client let in, the
// model found and named as its backend knows it, a backend picked, the
// request sent within server.request_timeout and the answer relayed
// whole. No ticket, no queue. Their refusals are the admitted routes'
// (errors.go): 401, model_not_found, no_healthy_backend, 502.

// letIn says whether the client is let in, answering 401 when it is not.
func (rt *runtime) letIn(ctx *fasthttp.RequestCtx) bool {
	if _, ok := rt.authenticate(ctx); !ok {
		unauthorized().write(ctx)
		return false
	}
	return true
}

// pick is the backend an unadmitted request goes to and its body as that
// backend knows the model: a backend of the model the client named (a
// served name swapped for the model's own in a JSON body), or any
// available one when it names none. It answers the client itself when
// there is none (false).
func (rt *runtime) pick(ctx *fasthttp.RequestCtx, model string, body []byte, isJSON bool) (*backends.Backend, []byte, bool) {
	if model == "" {
		for _, b := range rt.upstreams.Backends() {
			if b.Available() {
				return b, body, true
			}
		}
		noBackend(model).write(ctx)
		return nil, nil, false
	}
	m := rt.byClientName[model]
	if m == nil {
		unknownModel(model).write(ctx)
		return nil, nil, false
	}
	if m.name != model && isJSON {
		var err error
		if body, err = rewriteBody(body, askAsSent, 0, false, m.name); err != nil {
			badJSON(err).write(ctx)
			return nil, nil, false
		}
	}
	be, err := rt.upstreams.Pick(m.name, nil)
	if err != nil {
		noBackend(m.name).write(ctx)
		return nil, nil, false
	}
	return be, body, true
}

// relayWhole sends the client's request to be as method and uri, with
// body, within the request timeout, and relays the backend's answer
// whole, up to limit bytes: its status, its content type (ct when it has
// none) and its body.
func (s *Server) relayWhole(ctx *fasthttp.RequestCtx, rt *runtime, be *backends.Backend, method, uri string, body []byte, limit int64, ct string) {
	cctx, cancel := s.withTimeout(s.life.ctx, rt.cfg.Server.RequestTimeout.D)
	defer cancel()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	be.NewRequest(req, method, uri)
	if t := ctx.Request.Header.ContentType(); len(t) > 0 {
		req.Header.SetContentTypeBytes(t)
	}
	copyForwarded(&req.Header, &ctx.Request.Header)
	req.SetBodyRaw(body)
	resp, err := be.Do(cctx, req)
	if err != nil {
		s.upstreamError(be.Name(), err).write(ctx)
		return
	}
	defer resp.Release()
	answer, err := resp.ReadAll(limit)
	if err != nil {
		s.upstreamError(be.Name(), err).write(ctx)
		return
	}
	ctx.SetStatusCode(resp.Status())
	if t := resp.Header.ContentType(); len(t) > 0 {
		ctx.Response.Header.SetContentTypeBytes(t)
	} else if ct != "" {
		ctx.SetContentType(ct)
	}
	ctx.SetBody(answer)
}
