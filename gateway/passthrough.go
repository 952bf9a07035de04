package gateway

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// Passthrough: the routes a vLLM server answers that hold no KV cache the
// gateway must budget (/detokenize, /tokenizer_info, /version, the audio
// routes, ...) are forwarded as they are, so that kvgate can stand in
// front of a vLLM whatever else its clients call. Which are is the
// configuration's passthrough list; anything else is a 404 naming the
// routes served. A request is authenticated like any other and goes to an
// available backend of the model its body (a JSON object's "model", or a
// form's) names, or of any model when it names none. Nothing is admitted
// or reserved; the answer is relayed whole.

// defaultPassthrough is what is passed through without a passthrough list:
// vLLM's routes that neither generate nor pool.
var defaultPassthrough = []string{"/detokenize", "/tokenizer_info", "/version", "/v1/audio/*"}

// maxPassthroughAnswer bounds a relayed answer.
const maxPassthroughAnswer = 64 << 20

// validatePassthrough fills the default list and checks each entry: a path
// from the root, or a prefix ending in "/*", naming none of the gateway's
// own routes.
func (c *Config) validatePassthrough(p *problems) {
	if c.Passthrough == nil {
		c.Passthrough = append([]string(nil), defaultPassthrough...)
	}
	for i, r := range c.Passthrough {
		f := fmt.Sprintf("passthrough[%d]", i)
		if !strings.HasPrefix(r, "/") || strings.ContainsAny(r, "?# \t") || strings.Contains(strings.TrimSuffix(r, "/*"), "*") {
			p.bad(f, "%q is not a path from the root (/version) or a prefix ending in /* (/v1/audio/*)", r)
			continue
		}
		for _, own := range ownRoutes {
			if passes(r, own) || strings.HasPrefix(own+"/", strings.TrimSuffix(r, "*")) {
				p.bad(f, "%q takes in %s, which the gateway serves itself", r, own)
				break
			}
		}
	}
}

// passes says whether route (an entry of the list) takes in path.
func passes(route, path string) bool {
	if pre, ok := strings.CutSuffix(route, "/*"); ok {
		return strings.HasPrefix(path, pre+"/")
	}
	return path == route
}

// passthrough says whether the configuration passes path through.
func (rt *runtime) passthrough(path string) bool {
	for _, r := range rt.cfg.Passthrough {
		if passes(r, path) {
			return true
		}
	}
	return false
}

// servePassthrough forwards a passed-through request to a backend and
// relays its answer.
func (s *Server) servePassthrough(ctx *fasthttp.RequestCtx, _ string) {
	rt := s.rt.Load()
	if !rt.letIn(ctx) {
		return
	}
	model, aerr := s.passthroughModel(ctx, ctx.PostBody())
	if aerr != nil {
		aerr.write(ctx)
		return
	}
	be, body, ok := rt.pick(ctx, model, ctx.PostBody(), bytes.HasPrefix(ctx.Request.Header.ContentType(), []byte("application/json")))
	if !ok {
		return
	}
	// The normalized path the route was matched on (and the query), never
	// the raw one: what the backend is asked is what was allowed through.
	s.relayWhole(ctx, rt, be, string(ctx.Method()), string(ctx.URI().RequestURI()), body, maxPassthroughAnswer, "")
}

// passthroughModel is the model a passed-through request names: its JSON
// body's "model", or its form's; "" when it names none.
func (s *Server) passthroughModel(ctx *fasthttp.RequestCtx, body []byte) (string, *apiError) {
	ct := ctx.Request.Header.ContentType()
	switch {
	case len(body) == 0:
		return string(ctx.QueryArgs().Peek("model")), nil
	case bytes.HasPrefix(ct, []byte("multipart/form-data")), bytes.HasPrefix(ct, []byte("application/x-www-form-urlencoded")):
		return string(ctx.FormValue("model")), nil
	}
	p := s.parsers.Get()
	defer s.parsers.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		if bytes.HasPrefix(ct, []byte("application/json")) {
			return "", badJSON(err)
		}
		return "", nil // not JSON: the backend judges it
	}
	if v.Type() != fastjson.TypeObject {
		return "", nil
	}
	m := v.Get("model")
	if m == nil || m.Type() == fastjson.TypeNull {
		return "", nil
	}
	b, err := m.StringBytes()
	if err != nil || len(b) == 0 {
		return "", &apiError{status: 400, typ: typeInvalidRequest, param: "model", message: "model must be a non-empty string"}
	}
	return string(b), nil
}
