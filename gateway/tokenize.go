package gateway

import (
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// serveTokenize answers vLLM's POST /tokenize for a model the gateway
// serves, by asking one of its backends: clients (and kvgate loadtest, which
// sizes its prompts with it) count tokens as the model does without knowing
// where it runs. Nothing is admitted or reserved.
func (s *Server) serveTokenize(ctx *fasthttp.RequestCtx, _ string) {
	rt := s.rt.Load()
	if !rt.letIn(ctx) {
		return
	}
	p := s.parsers.Get()
	v, err := p.ParseBytes(ctx.PostBody())
	var model string
	if err == nil && v.Type() == fastjson.TypeObject {
		model = string(v.GetStringBytes("model"))
	}
	s.parsers.Put(p)
	switch {
	case err != nil:
		badJSON(err).write(ctx)
		return
	case model == "":
		(&apiError{status: 400, typ: typeInvalidRequest, param: "model", message: "you must provide a model parameter (a non-empty string)"}).write(ctx)
		return
	}
	be, body, ok := rt.pick(ctx, model, ctx.PostBody(), true)
	if !ok {
		return
	}
	s.relayWhole(ctx, rt, be, fasthttp.MethodPost, "/tokenize", body, maxTokenizeAnswer, "application/json")
}

// maxTokenizeAnswer bounds a relayed /tokenize answer.
const maxTokenizeAnswer = 1 << 20
