package gateway

import (
	"bytes"
	"strconv"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/jsonscan"
)

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
		x.body.closeDelimited(ctx, x.rt.cfg.Server.writeTimeout())
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
