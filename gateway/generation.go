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

// reserveGeneration is the Responses and Messages APIs' reservation
// step: chat's, after the stored conversation a Responses request may
// continue, with the model's default length set in the API's own field.
func reserveGeneration(x *exchange, ctx *fasthttp.RequestCtx, prompts []int, exact []bool) bool {
	if x.req.gen.prior {
		x.priorContext(prompts, exact)
	}
	if !x.reserved(ctx, x.reserve(prompts, exact)) {
		return false
	}
	if x.injectMax > 0 {
		// The model's default length, which the reservation assumed, in
		// the API's own field: vLLM's Responses API reads no max_tokens.
		// (A Messages body always has its max_tokens.)
		body, err := withMaxOutput(ctx.PostBody(), x.injectMax)
		if err != nil {
			x.s.log.Error("set max_output_tokens in a parsed body", "err", err)
			x.fail(ctx, internalError(), outcomeFailed, "internal")
			return false
		}
		x.injectMax = 0
		ctx.Request.SetBody(body) // the prompts found in the old body were counted already
	}
	return true
}

// generationAdmission is how a Responses or Messages request runs: a
// stream may be stopped by the guard, never resumed (x.resume stays nil).
func generationAdmission(x *exchange) admission.Request {
	areq := admission.Request{Opaque: !x.req.stream, Pinned: x.req.pinned}
	if x.req.stream {
		areq.Stopper = x
		areq.NoResume = x.rt.resumes // as chat's (completion.go)
	}
	return areq
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
// A backend's error in another shape — FastAPI's {"detail": ...}, which
// vLLM answers for a route or a body it refuses, or plain text — is
// rewritten too, so that an Anthropic client always reads its own shape.
// An answer already in Anthropic's shape, and a stream, are left as they
// are.
func (s *Server) anthropicErrors(ctx *fasthttp.RequestCtx) {
	status := ctx.Response.StatusCode()
	if status < 400 || ctx.Response.IsBodyStream() {
		return
	}
	p := s.parsers.Get()
	defer s.parsers.Put(p)
	body := ctx.Response.Body()
	v, err := p.ParseBytes(body)
	if err != nil || v.Type() != fastjson.TypeObject {
		msg := strings.TrimSpace(string(body[:min(len(body), 512)]))
		if msg == "" {
			msg = fasthttp.StatusMessage(status)
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(appendAnthropicError(nil, status, msg))
		return
	}
	if v.Get("type") != nil {
		return
	}
	if d := v.Get("detail"); d != nil {
		ctx.SetBody(appendAnthropicError(nil, status, fastAPIDetail(d)))
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

// fastAPIDetail is the message of FastAPI's error detail: a string, or a
// list of validation errors, each a location and a message.
func fastAPIDetail(d *fastjson.Value) string {
	if d.Type() == fastjson.TypeString {
		return string(d.GetStringBytes())
	}
	var parts []string
	for _, item := range d.GetArray() {
		var loc []string
		for _, l := range item.GetArray("loc") {
			if l.Type() == fastjson.TypeString {
				loc = append(loc, string(l.GetStringBytes()))
			} else {
				loc = append(loc, l.String())
			}
		}
		msg := string(item.GetStringBytes("msg"))
		if len(loc) > 0 {
			msg = strings.Join(loc, ".") + ": " + msg
		}
		parts = append(parts, msg)
	}
	if len(parts) == 0 {
		return d.String()
	}
	return strings.Join(parts, "; ")
}
