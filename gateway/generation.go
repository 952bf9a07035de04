package gateway

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/internal/jsonscan"
)

// The Responses and Messages APIs are admitted as chat is: the body read
// once (parse_generation.go), the prompt counted, the output reserved up
// to the length field, the stream followed token by token, the usage read
// at the end (relay_responses.go). What differs is at the edges: the
// fields, the stream's typed events, and, for Messages, the error shape,
// which is Anthropic's. Their streams are never resumed: a continuation
// would have to be written in each API's own terms.

// serveGenerationRoute serves a route of the Responses or Messages API:
// POST to the API's own route is admitted; its sub-routes (a stored
// response, its cancellation, a token count) are passed through to a
// backend, since they generate nothing.
func (s *Server) serveGenerationRoute(ctx *fasthttp.RequestCtx, kind endpoint, sub bool) {
	if kind == messagesAPI {
		defer s.anthropicErrors(ctx)
	}
	switch {
	case sub:
		s.servePassthrough(ctx, s.rt.Load())
	case !ctx.IsPost():
		methodNotAllowed(ctx, "POST")
	default:
		s.serveGeneration(ctx, kind)
	}
}

// serveGeneration is serveCompletion for the Responses and Messages
// APIs: the same steps, with their reading of the body and one sequence
// per request.
func (s *Server) serveGeneration(ctx *fasthttp.RequestCtx, kind endpoint) {
	x := s.begin(ctx, kind)
	defer x.leave()

	tn, ok := x.readBody(ctx, kind, parseGeneration)
	if !ok {
		return
	}
	req := x.req
	prompts, exact, ok := x.count(ctx, tn, generationTexts)
	if !ok {
		return
	}
	if req.gen.prior {
		x.priorContext(prompts, exact)
	}
	if e := x.reserve(prompts, exact); e != nil {
		x.fail(ctx, e, outcomeRejected, e.code)
		return
	}
	if x.injectMax > 0 {
		// The model's default length, which the reservation assumed, in
		// the API's own field: vLLM's Responses API reads no max_tokens.
		// (A Messages body always has its max_tokens.)
		body, err := withMaxOutput(ctx.PostBody(), x.injectMax)
		if err != nil {
			x.s.log.Error("set max_output_tokens in a parsed body", "err", err)
			x.fail(ctx, &apiError{status: 500, typ: typeServer, code: "internal_error", message: "internal error"}, outcomeFailed, "internal")
			return
		}
		x.injectMax = 0
		ctx.Request.SetBody(body) // the prompts found in the old body were counted already
	}
	areq := admission.Request{Opaque: !req.stream, Pinned: req.pinned}
	if req.stream {
		areq.Stopper = x               // stopped, never resumed: x.resume stays nil
		areq.NoResume = x.rt.resumes() // as chat's (exchange.go)
	}
	if !x.admit(ctx, areq) {
		return
	}
	resp, ok := x.upstream(ctx)
	if !ok {
		return
	}
	x.answer(ctx, resp)
}

// priorContext sizes a Responses request that continues a stored
// conversation (previous_response_id, conversation): the backend puts
// what it stored before the input, and the gateway sees none of it. So
// the prompt is taken, as an estimate, to fill the context but for the
// output: the reservation is the whole context, the most one sequence
// can hold, and never less than what runs.
func (x *exchange) priorContext(prompts []int, exact []bool) {
	out := max(x.req.maxTokens, x.m.defaultMax, 1)
	prompts[0], exact[0] = max(prompts[0], x.m.maxLen-out), false
	x.chains = nil
}

// withMaxOutput is body with max_output_tokens set to n: the member added
// first, any the body had (null: the parse accepted no other) removed,
// every other byte as the client sent it.
func withMaxOutput(body []byte, n int) ([]byte, error) {
	out := make([]byte, 0, len(body)+32)
	out = strconv.AppendInt(append(out, `{"max_output_tokens":`...), int64(n), 10)
	err := jsonscan.Members(body, func(name []byte, start, _, end int) bool {
		if !keyIs(name, "max_output_tokens") {
			out = append(append(out, ','), body[start:end]...)
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("max_output_tokens: %w", err)
	}
	return append(out, '}'), nil
}

// anthropicErrors rewrites an error answered in OpenAI's shape, the
// gateway's own or a backend's, into Anthropic's:
// {"type":"error","error":{"type":...,"message":...}}. Anthropic's errors
// have no param, so the message names the field when it does not already.
// An answer already in Anthropic's shape, and a stream, are left as they
// are.
func (s *Server) anthropicErrors(ctx *fasthttp.RequestCtx) {
	status := ctx.Response.StatusCode()
	if status < 400 || ctx.Response.IsBodyStream() {
		return
	}
	p := s.parsers.Get()
	defer s.parsers.Put(p)
	v, err := p.ParseBytes(ctx.Response.Body())
	if err != nil || v.Type() != fastjson.TypeObject || v.Get("type") != nil {
		return
	}
	e := v.Get("error")
	if e == nil || e.Type() != fastjson.TypeObject {
		return
	}
	msg := string(e.GetStringBytes("message"))
	if param := string(e.GetStringBytes("param")); param != "" && !strings.Contains(msg, param) {
		msg = param + ": " + msg
	}
	ctx.SetBody(appendAnthropicError(nil, status, msg))
}

// appendAnthropicError appends an error body in Anthropic's shape.
func appendAnthropicError(dst []byte, status int, msg string) []byte {
	return append(appendAnthropicErrorObject(append(dst, `{"type":"error","error":`...), status, msg), '}')
}

// appendAnthropicErrorObject appends the error member of Anthropic's
// error body: its type, told by the HTTP status as Anthropic's API tells
// it, and the message.
func appendAnthropicErrorObject(dst []byte, status int, msg string) []byte {
	typ := "api_error"
	switch status {
	case 400, 422:
		typ = "invalid_request_error"
	case 401:
		typ = "authentication_error"
	case 403:
		typ = "permission_error"
	case 404:
		typ = "not_found_error"
	case 413:
		typ = "request_too_large"
	case 429:
		typ = "rate_limit_error"
	case 503, 529:
		typ = "overloaded_error"
	}
	dst = jsonscan.AppendString(append(dst, `{"type":`...), typ)
	dst = jsonscan.AppendString(append(dst, `,"message":`...), msg)
	return append(dst, '}')
}
