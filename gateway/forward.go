package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/jsonscan"
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

// usageAsk is the usage a stream's body asks the backend for.
type usageAsk uint8

const (
	askAsSent     usageAsk = iota // the client's stream_options, untouched
	askFinal                      // include_usage: the count at the end
	askContinuous                 // and continuous_usage_stats: on every chunk too
)

// rewriteBody returns body with what the gateway must add or remove: with
// usage, stream_options.include_usage, and continuous_usage_stats where
// the backend takes it (so it learns the real token counts of a stream:
// at its end, and on every chunk as it goes, where vLLM and servers like
// it report them); with maxTokens > 0, max_tokens (the model's
// default_max_tokens, which the reservation assumed); with dropMaxCompletion,
// no max_completion_tokens (a /v1/completions body, whose reservation
// followed max_tokens). Members are added after the opening brace and
// removed by their bytes; every other byte stays as the client sent it (a
// re-serialised body would re-quote keys, and fastjson's quoting is not
// always JSON's). body is one parseRequest accepted: it is read by a scan,
// not parsed again.
func rewriteBody(body []byte, ask usageAsk, maxTokens int, dropMaxCompletion bool, model string) ([]byte, error) {
	usage := ask != askAsSent
	drop := func(name []byte) bool {
		return (usage && keyIs(name, "stream_options")) || (model != "" && keyIs(name, "model")) ||
			(maxTokens > 0 && keyIs(name, "max_tokens")) ||
			((maxTokens > 0 || dropMaxCompletion) && keyIs(name, "max_completion_tokens"))
	}
	// One pass over the members: the spans kept, and the stream options
	// (an object or null: parseRequest refused anything else).
	var keptBuf [16][2]int // a request has a few members: no allocation for their spans
	kept := keptBuf[:0]
	var so []byte
	if err := jsonscan.Members(body, func(name []byte, start, value, end int) bool {
		if !drop(name) {
			kept = append(kept, [2]int{start, end})
		} else if usage && so == nil && keyIs(name, "stream_options") {
			so = body[value:end]
		}
		return true
	}); err != nil {
		return nil, err
	}
	var addBuf [128]byte // the members added, before they are copied into out
	add := addBuf[:0]
	if usage {
		var err error
		if add, err = appendStreamOptions(add, ask, so); err != nil {
			return nil, err
		}
	}
	if maxTokens > 0 {
		add = append(strconv.AppendInt(append(add, `"max_tokens":`...), int64(maxTokens), 10), ',')
	}
	if model != "" {
		add = append(jsonscan.AppendString(append(add, `"model":`...), model), ',')
	}
	open := bytes.IndexByte(body, '{')
	out := append(append(make([]byte, 0, len(body)+len(add)), body[:open+1]...), add...)
	for k, m := range kept {
		if k > 0 {
			out = append(out, ',')
		}
		out = append(out, body[m[0]:m[1]]...)
	}
	if len(kept) == 0 && len(add) > 0 {
		out = out[:len(out)-1] // the added members' trailing comma
	}
	return append(out, '}'), nil
}

// appendStreamOptions appends the stream options that ask for the usage
// as ask says, the client's others (so, its own object or null) kept.
func appendStreamOptions(add []byte, ask usageAsk, so []byte) ([]byte, error) {
	add = append(add, `"stream_options":{"include_usage":true`...)
	if ask == askContinuous {
		add = append(add, `,"continuous_usage_stats":true`...)
	}
	if len(so) > 0 && so[0] == '{' {
		// Keep the client's other stream options.
		if err := jsonscan.Members(so, func(name []byte, start, _, end int) bool {
			if !keyIs(name, "include_usage") && !keyIs(name, "continuous_usage_stats") {
				add = append(append(add, ','), so[start:end]...)
			}
			return true
		}); err != nil {
			return nil, fmt.Errorf("stream_options: %w", err)
		}
	}
	return append(add, "},"...), nil
}

// keyIs reports whether a key, as written between its quotes, names want:
// a key spelled with escapes (max\u005ftokens) is the same key to the
// backend's parser.
func keyIs(raw []byte, want string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == want
	}
	var k string
	return json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &k) == nil && k == want
}

// backendFor picks an available backend of g for model, other than those
// in skip, rotating among them so that several backends of one GPU share
// its pool's load.
func (g *gpu) backendFor(model string, skip map[*backends.Backend]bool) *backends.Backend {
	n := len(g.backends)
	start := int(g.rr.Add(1) % uint64(n))
	for i := range n {
		be := g.backends[(start+i)%n]
		if !skip[be] && be.Serves(model) && be.Available() {
			return be
		}
	}
	return nil
}
