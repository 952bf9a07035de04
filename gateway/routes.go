package gateway

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/valyala/fasthttp"
)

// Routing: which handler serves a request, what a 404 lists, and what a
// wrong method is told. The handlers themselves live with their concern
// (exchange.go, pooling.go, generation.go, passthrough.go, tokenize.go,
// status.go).

// servedRoutes is what a 404 lists: the routes a client may call.
const servedRoutes = "POST /v1/chat/completions, POST /v1/completions, POST /tokenize, " +
	"POST /v1/responses, GET /v1/responses/{id}, POST /v1/responses/{id}/cancel, POST /v1/messages, POST /v1/messages/count_tokens, " +
	"POST /v1/embeddings, POST /pooling, POST /classify, POST /score, POST /v1/score, POST /rerank, POST /v1/rerank, POST /v2/rerank, " +
	"GET /v1/models, GET /v1/models/{id}, " +
	"GET /healthz, GET /readyz (and /health), GET /metrics, GET /status"

// handle routes a request; no panic reaches the client.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic serving request", "path", string(ctx.Path()), "panic", p, "stack", string(debug.Stack()))
			(&apiError{status: 500, typ: typeServer, code: "internal_error", message: "internal error"}).write(ctx)
		}
	}()
	stampRequestID(ctx)
	if s.conns.past(ctx.Conn()) && !isProbe(ctx.Path()) {
		s.conns.refuse(ctx)
		return
	}
	if s.draining.Load() {
		ctx.SetConnectionClose() // keep-alive clients reconnect to a replica that stays
	}
	if c := s.rt.Load().cors; c != nil && c.apply(ctx) {
		return // a preflight, answered
	} else if c == nil && isPreflight(ctx) {
		refuseUnconfiguredPreflight(ctx)
		return
	}
	// The completion paths first, compared without making strings of them.
	// A trailing slash names the same route, as vLLM (Starlette) takes it.
	p := ctx.Path()
	if len(p) > 1 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	switch string(p) {
	case "/v1/chat/completions":
		s.serveCompletionPost(ctx, chatCompletions)
		return
	case "/v1/completions":
		s.serveCompletionPost(ctx, completions)
		return
	}
	if kind, ok := poolingEndpoint(p); ok {
		s.servePoolingPost(ctx, kind)
		return
	}
	if kind, sub, ok := generationEndpoint(p); ok {
		s.serveGenerationRoute(ctx, kind, sub)
		return
	}
	path := string(p)
	method := string(ctx.Method())
	switch path {
	case "/v1/models":
		s.serveModels(ctx, "")
	case "/tokenize":
		s.serveTokenize(ctx)
	case "/metrics":
		if !s.rt.Load().adminAllowed(ctx) {
			unauthorized().write(ctx)
			return
		}
		s.metricsHandler(ctx)
	case "/healthz":
		writeJSON(ctx, 200, map[string]string{"status": "ok"})
	case "/readyz", "/health": // /health as vLLM spells it, for tools that probe backends
		switch {
		case s.draining.Load():
			(&apiError{status: 503, typ: typeServer, code: "draining", message: "The gateway is shutting down."}).write(ctx)
		case !s.rt.Load().upstreams.Ready():
			(&apiError{status: 503, typ: typeServer, code: "no_healthy_backend", message: "no backend is healthy"}).write(ctx)
		case s.fleet != nil && !s.fleet.Usable():
			(&apiError{status: 503, typ: typeServer, code: "no_capacity",
				message: "this replica cannot reach the shared budget's Redis and has no capacity to admit on"}).write(ctx)
		default:
			writeJSON(ctx, 200, map[string]string{"status": "ready"})
		}
	case "/status":
		if !s.rt.Load().adminAllowed(ctx) {
			unauthorized().write(ctx)
			return
		}
		writeJSON(ctx, 200, s.status())
	default:
		if id, ok := strings.CutPrefix(path, "/v1/models/"); ok && id != "" {
			s.serveModels(ctx, id) // ids may hold slashes (org/model)
			return
		}
		rt := s.rt.Load()
		if rt.passthrough(path) {
			s.servePassthrough(ctx, rt)
			return
		}
		served := servedRoutes
		if len(rt.cfg.Passthrough) > 0 {
			served += ", and passes through " + strings.Join(rt.cfg.Passthrough, ", ")
		}
		(&apiError{status: 404, typ: typeInvalidRequest, code: "unknown_url",
			message: fmt.Sprintf("Unknown request URL: %s %s. This gateway serves %s.", method, string(ctx.Path()), served)}).write(ctx)
	}
}

func (s *Server) serveCompletionPost(ctx *fasthttp.RequestCtx, kind endpoint) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	s.serveCompletion(ctx, kind)
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	(&apiError{status: 405, typ: typeInvalidRequest, code: "method_not_allowed",
		message: fmt.Sprintf("%s is not allowed here; use %s.", ctx.Method(), allow)}).write(ctx)
	ctx.Response.Header.Set("Allow", allow)
}
