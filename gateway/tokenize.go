package gateway

import (
	"fmt"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// serveTokenize answers vLLM's POST /tokenize for a model the gateway
// serves, by asking one of its backends: clients (and kvgate loadtest, which
// sizes its prompts with it) count tokens as the model does without knowing
// where it runs. Nothing is admitted or reserved.
func (s *Server) serveTokenize(ctx *fasthttp.RequestCtx, _ string) {
	rt := s.rt.Load()
	if _, ok := rt.authenticate(ctx); !ok {
		(&apiError{status: 401, typ: typeAuthentication, code: "invalid_api_key",
			message: "Incorrect or missing API key. Send it as: Authorization: Bearer <key>."}).write(ctx)
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
		(&apiError{status: 400, typ: typeInvalidRequest, message: fmt.Sprintf("We could not parse the JSON body of your request: %v", err)}).write(ctx)
		return
	case model == "":
		(&apiError{status: 400, typ: typeInvalidRequest, param: "model", message: "you must provide a model parameter (a non-empty string)"}).write(ctx)
		return
	case rt.byClientName[model] == nil:
		(&apiError{status: 404, typ: typeInvalidRequest, param: "model", code: "model_not_found",
			message: fmt.Sprintf("The model `%s` does not exist.", model)}).write(ctx)
		return
	}
	body := ctx.PostBody()
	if m := rt.byClientName[model]; m.name != model {
		// A served_name: the backend knows the model by its own name.
		if body, err = rewriteBody(body, askAsSent, 0, false, m.name); err != nil {
			(&apiError{status: 400, typ: typeInvalidRequest, message: fmt.Sprintf("We could not parse the JSON body of your request: %v", err)}).write(ctx)
			return
		}
		model = m.name
	}
	be, err := rt.upstreams.Pick(model, nil)
	if err != nil {
		noBackend(model).write(ctx)
		return
	}
	cctx, cancel := s.withTimeout(s.life, rt.cfg.Server.requestTimeout())
	defer cancel()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	be.NewRequest(req, fasthttp.MethodPost, "/tokenize")
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	resp, err := be.Do(cctx, req)
	if err != nil {
		(&apiError{status: 502, typ: typeServer, code: "upstream_error", message: fmt.Sprintf("backend %s: %v", be.Name(), err)}).write(ctx)
		return
	}
	defer resp.Release()
	answer, err := resp.ReadAll(1 << 20)
	if err != nil {
		(&apiError{status: 502, typ: typeServer, code: "upstream_error", message: fmt.Sprintf("backend %s: %v", be.Name(), err)}).write(ctx)
		return
	}
	ctx.SetStatusCode(resp.Status())
	ctx.SetContentType("application/json")
	ctx.SetBody(answer)
}
