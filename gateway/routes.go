package gateway

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/admission"
)

// The table of routes. Every route the gateway serves is one entry of
// routeTable: its method, its path, how the 404 lists it and what serves
// it — for an admitted API, the entry of apis that says how its body is
// read, its prompts found, its reservation made, how it runs once admitted
// and in whose shape it is refused. The dispatch (handle), the 404's list,
// the paths no passthrough entry may take (ownRoutes), the admitted APIs'
// paths (endpoint.path, poolingPaths, generationPaths) and the spans'
// names are all read from these two tables; adding a route is adding an
// entry, with its reader and its answer in files of their own.

// endpoint is which API an admitted request is for: an index into apis.
type endpoint uint8

const (
	chatCompletions endpoint = iota
	completions
	// The generation APIs vLLM serves besides chat and completions
	// (parse_generation.go).
	responsesAPI
	messagesAPI
	// The pooling APIs (parse_pooling.go).
	embeddings
	poolingRoute
	classify
	score
	scoreV1
	rerank
	rerankV1
	rerankV2
	numEndpoints
)

// parseFunc reads a route's body: one reading, every field admission
// needs (parse.go, parse_pooling.go, parse_generation.go).
type parseFunc func(p *fastjson.Parser, body []byte, kind endpoint) (*request, error)

// textsFunc finds the prompts' text in a parsed body, for a model its
// backend counts.
type textsFunc func(pp *fastjson.ParserPool, body []byte, r *request) error

// api is how an admitted API's requests are read, reserved, run and
// answered: the steps of the request's loop (loop.go) take these.
type api struct {
	path  string
	parse parseFunc
	texts textsFunc
	// reserve turns the prompts' counts into the reservation, answering
	// and finishing the request itself when it cannot (false).
	reserve func(x *exchange, ctx *fasthttp.RequestCtx, prompts []int, exact []bool) bool
	// admission is how the request runs once admitted: streamed or whole,
	// stopped or resumed by the guard.
	admission func(x *exchange) admission.Request
	// typed: its streams are typed events (event: NAME, data:
	// {"type":NAME,...}) ending with a last event of their own rather
	// than chat's data: [DONE] (relay_responses.go).
	typed bool
	// pooling: it runs its inputs as prefills and decodes nothing
	// (pooling.go).
	pooling bool
	// promptField and lengthField are the fields its prompt is in and
	// its output is capped by, as errors name them.
	promptField, lengthField string
}

// apis are the admitted APIs, by endpoint.
var apis [numEndpoints]api

func init() {
	chat := api{parse: parseRequest, texts: promptTexts, reserve: reserveCompletion, admission: completionAdmission,
		promptField: "messages", lengthField: "max_tokens"}
	completion := chat
	completion.promptField = "prompt"
	messages := api{parse: parseGeneration, texts: generationTexts, reserve: reserveGeneration, admission: generationAdmission, typed: true,
		promptField: "messages", lengthField: "max_tokens"}
	responses := messages
	responses.promptField, responses.lengthField = "input", "max_output_tokens"
	pool := api{parse: parsePooling, texts: poolingTexts, reserve: reservePooling, admission: poolingAdmission, pooling: true,
		promptField: "messages", lengthField: "max_tokens"}
	for e, a := range map[endpoint]api{
		chatCompletions: chat, completions: completion,
		responsesAPI: responses, messagesAPI: messages,
		embeddings: pool, poolingRoute: pool, classify: pool, score: pool, scoreV1: pool, rerank: pool, rerankV1: pool, rerankV2: pool,
	} {
		apis[e] = a
	}
	for _, r := range routeTable {
		if r.admits {
			apis[r.api].path = r.path
		}
	}
	poolingPaths = apiPaths(func(a api) bool { return a.pooling })
	generationPaths = apiPaths(func(a api) bool { return a.typed })
	for e := range spanNames {
		spanNames[e] = "POST " + endpoint(e).path()
	}
}

func (e endpoint) path() string { return apis[e].path }

// typedEvents says whether e's streams are typed events.
func (e endpoint) typedEvents() bool { return apis[e].typed }

// pooling says whether e is a pooling endpoint.
func (e endpoint) pooling() bool { return apis[e].pooling }

// lengthParam is the field that caps a request's output, for errors.
func (r *request) lengthParam() string { return apis[r.kind].lengthField }

// promptParam is the field a request's prompt is in, for errors.
func (r *request) promptParam() string { return apis[r.kind].promptField }

// route is one entry of the table of routes.
type route struct {
	method string // the method it answers; any other gets a 405 naming it ("": any)
	path   string // its path; one ending in "/" takes in the paths below it
	list   string // how the 404 lists it: "" its method and path, "-" not at all
	// admits: the route admits requests of api.
	admits bool
	api    endpoint
	// serve serves any other route; rest is what of the path follows a
	// prefix.
	serve func(s *Server, ctx *fasthttp.RequestCtx, rest string)
	// passed: the route is passed through to a backend, not the gateway's
	// own (ownRoutes leaves it out).
	passed bool
	// errors rewrites the errors answered into the API's shape; nil:
	// OpenAI's, as written.
	errors func(s *Server, ctx *fasthttp.RequestCtx)
}

// routeTable is every route the gateway serves, in the order the 404
// lists them.
var routeTable = []route{
	{method: "POST", path: "/v1/chat/completions", admits: true, api: chatCompletions},
	{method: "POST", path: "/v1/completions", admits: true, api: completions},
	{method: "POST", path: "/tokenize", serve: (*Server).serveTokenize},
	{method: "POST", path: "/v1/responses", admits: true, api: responsesAPI},
	{path: "/v1/responses/", list: "GET /v1/responses/{id}, POST /v1/responses/{id}/cancel", serve: (*Server).servePassthrough, passed: true},
	{method: "POST", path: "/v1/messages", admits: true, api: messagesAPI, errors: (*Server).anthropicErrors},
	{path: "/v1/messages/count_tokens", list: "POST /v1/messages/count_tokens", serve: (*Server).servePassthrough, passed: true, errors: (*Server).anthropicErrors},
	{method: "POST", path: "/v1/embeddings", admits: true, api: embeddings},
	{method: "POST", path: "/pooling", admits: true, api: poolingRoute},
	{method: "POST", path: "/classify", admits: true, api: classify},
	{method: "POST", path: "/score", admits: true, api: score},
	{method: "POST", path: "/v1/score", admits: true, api: scoreV1},
	{method: "POST", path: "/rerank", admits: true, api: rerank},
	{method: "POST", path: "/v1/rerank", admits: true, api: rerankV1},
	{method: "POST", path: "/v2/rerank", admits: true, api: rerankV2},
	{method: "GET", path: "/v1/models", serve: (*Server).serveModels},
	{method: "GET", path: "/v1/models/", list: "GET /v1/models/{id}", serve: (*Server).serveModels}, // ids may hold slashes (org/model)
	{path: "/healthz", list: "GET /healthz", serve: (*Server).serveLive},
	{path: "/readyz", list: "GET /readyz (and /health)", serve: (*Server).serveReady},
	{path: "/health", list: "-", serve: (*Server).serveReady}, // as vLLM spells it, for tools that probe backends
	{path: "/metrics", list: "GET /metrics", serve: (*Server).serveMetrics},
	{path: "/status", list: "GET /status", serve: (*Server).serveStatus},
}

// routes is a table of routes as the dispatch reads it.
type routes struct {
	exact    map[string]*route
	prefixes []*route
	served   string   // what a 404 lists
	own      []string // the gateway's own paths, which no passthrough entry may name
}

func newRoutes(table []route) *routes {
	rs := &routes{exact: map[string]*route{}}
	var served []string
	for i := range table {
		r := &table[i]
		if strings.HasSuffix(r.path, "/") {
			rs.prefixes = append(rs.prefixes, r)
		} else {
			rs.exact[r.path] = r
			if !r.passed {
				rs.own = append(rs.own, r.path)
			}
		}
		switch r.list {
		case "":
			served = append(served, r.method+" "+r.path)
		case "-":
		default:
			served = append(served, r.list)
		}
	}
	rs.served = strings.Join(served, ", ")
	return rs
}

// defaultRoutes is routeTable as the dispatch reads it.
var defaultRoutes = newRoutes(routeTable)

// ownRoutes are the gateway's own routes, which no passthrough entry may
// name.
var ownRoutes = defaultRoutes.own

// apiPaths are the paths of the admitted APIs that are.
func apiPaths(is func(api) bool) []string {
	var paths []string
	for _, r := range routeTable {
		if r.admits && is(apis[r.api]) {
			paths = append(paths, r.path)
		}
	}
	return paths
}

// poolingPaths and generationPaths are the pooling APIs' and the typed
// generation APIs' routes, in the order of their endpoints; spanNames are
// the request spans' names, by endpoint: method and route. All are read
// from the tables once, at start.
var (
	poolingPaths, generationPaths []string
	spanNames                     [numEndpoints]string
)

// find is the route of a path (its trailing slash cut), and what of the
// path follows the route's prefix; nil if none serves it.
func (rs *routes) find(p []byte) (*route, string) {
	if r := rs.exact[string(p)]; r != nil {
		return r, ""
	}
	for _, r := range rs.prefixes {
		if len(p) > len(r.path) && string(p[:len(r.path)]) == r.path {
			return r, string(p[len(r.path):])
		}
	}
	return nil, ""
}

// handle routes a request; no panic reaches the client.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic serving request", "path", string(ctx.Path()), "panic", p, "stack", string(debug.Stack()))
			internalError().write(ctx)
		}
	}()
	stampRequestID(ctx)
	if s.conns.past(ctx.Conn()) && !isProbe(ctx.Path()) {
		s.conns.refuse(ctx)
		return
	}
	if s.life.draining.Load() {
		ctx.SetConnectionClose() // keep-alive clients reconnect to a replica that stays
	}
	if c := s.rt.Load().cors; c != nil && c.apply(ctx) {
		return // a preflight, answered
	} else if c == nil && isPreflight(ctx) {
		refuseUnconfiguredPreflight(ctx)
		return
	}
	// A trailing slash names the same route, as vLLM (Starlette) takes it.
	p := ctx.Path()
	if len(p) > 1 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	r, rest := s.routes.find(p)
	if r == nil {
		s.unrouted(ctx, string(p))
		return
	}
	if r.errors != nil {
		defer r.errors(s, ctx)
	}
	switch {
	case r.method != "" && string(ctx.Method()) != r.method:
		methodNotAllowed(ctx, r.method)
	case r.admits:
		s.serveAdmitted(ctx, r.api)
	default:
		r.serve(s, ctx, rest)
	}
}

// unrouted passes a path no route serves through when the configuration
// says to, and answers 404 naming the routes served otherwise.
func (s *Server) unrouted(ctx *fasthttp.RequestCtx, path string) {
	rt := s.rt.Load()
	if rt.passthrough(path) {
		s.servePassthrough(ctx, "")
		return
	}
	served := s.routes.served
	if len(rt.cfg.Passthrough) > 0 {
		served += ", and passes through " + strings.Join(rt.cfg.Passthrough, ", ")
	}
	(&apiError{status: 404, typ: typeInvalidRequest, code: "unknown_url",
		message: fmt.Sprintf("Unknown request URL: %s %s. This gateway serves %s.", ctx.Method(), string(ctx.Path()), served)}).write(ctx)
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	(&apiError{status: 405, typ: typeInvalidRequest, code: "method_not_allowed",
		message: fmt.Sprintf("%s is not allowed here; use %s.", ctx.Method(), allow)}).write(ctx)
	ctx.Response.Header.Set("Allow", allow)
}

// serveLive answers the liveness probe.
func (s *Server) serveLive(ctx *fasthttp.RequestCtx, _ string) {
	writeJSON(ctx, 200, map[string]string{"status": "ok"})
}

// serveReady answers the readiness probe.
func (s *Server) serveReady(ctx *fasthttp.RequestCtx, _ string) {
	switch {
	case s.life.draining.Load():
		(&apiError{status: 503, typ: typeServer, code: "draining", message: "The gateway is shutting down."}).write(ctx)
	case !s.rt.Load().upstreams.Ready():
		(&apiError{status: 503, typ: typeServer, code: "no_healthy_backend", message: "no backend is healthy"}).write(ctx)
	case s.shared != nil && !s.shared.Usable():
		(&apiError{status: 503, typ: typeServer, code: "no_capacity",
			message: "this replica cannot reach the shared budget's Redis and has no capacity to admit on"}).write(ctx)
	default:
		writeJSON(ctx, 200, map[string]string{"status": "ready"})
	}
}

// serveMetrics answers the Prometheus scrape, to an admin.
func (s *Server) serveMetrics(ctx *fasthttp.RequestCtx, _ string) {
	if !s.rt.Load().adminAllowed(ctx) {
		unauthorized().write(ctx)
		return
	}
	s.metricsHandler(ctx)
}

// serveStatus answers the operator's view, to an admin.
func (s *Server) serveStatus(ctx *fasthttp.RequestCtx, _ string) {
	if !s.rt.Load().adminAllowed(ctx) {
		unauthorized().write(ctx)
		return
	}
	writeJSON(ctx, 200, s.status())
}
