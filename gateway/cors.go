package gateway

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"
)

// CORS, for browser apps that call the gateway directly (vLLM's
// --allowed-origins, --allowed-methods, --allowed-headers are the model).
// Off unless server.cors is configured: a gateway is usually called by
// servers, and a browser calling it holds an API key the page exposes.

// CORSConfig is server.cors.
type CORSConfig struct {
	// AllowedOrigins are the origins (scheme://host[:port]) whose pages may
	// call the gateway, or "*" for any. Required.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// AllowedMethods a preflight may ask for. Default GET, POST, OPTIONS.
	AllowedMethods []string `yaml:"allowed_methods"`
	// AllowedHeaders a preflight may ask for, or "*" for any; a trailing *
	// is a prefix. Default Authorization, Content-Type, X-Request-Id, the
	// OpenAI SDKs' own (OpenAI-Organization, OpenAI-Project, X-Stainless-*)
	// and the default priority and session headers.
	AllowedHeaders []string `yaml:"allowed_headers"`
}

// corsExposed are the answer's headers a page's script may read: what
// tells it when to retry and which request it was. (The allowed methods
// and headers' defaults are configdefaults.go's.)
const corsExposed = "Retry-After, Retry-After-Ms, X-Should-Retry, X-Request-Id, X-Kvgate-Backend, X-Kvgate-Queue-Ms"

// validate checks c (field is its config path) and fills its defaults.
func (c *CORSConfig) validate(field string, bad func(field, format string, a ...any)) {
	if len(c.AllowedOrigins) == 0 {
		bad(field+".allowed_origins", "list at least one origin (scheme://host[:port]) or \"*\"")
	}
	for i, o := range c.AllowedOrigins {
		if o == "*" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			bad(fmt.Sprintf("%s.allowed_origins[%d]", field, i), "%q is not an origin: want scheme://host[:port], no path, or \"*\"", o)
		}
		c.AllowedOrigins[i] = strings.TrimSuffix(o, "/")
	}
	if len(c.AllowedMethods) == 0 {
		c.AllowedMethods = defaultCORSMethods
	}
	for i, m := range c.AllowedMethods {
		if m == "" || strings.ContainsAny(m, " ,") {
			bad(fmt.Sprintf("%s.allowed_methods[%d]", field, i), "%q is not an HTTP method", m)
		}
		c.AllowedMethods[i] = strings.ToUpper(m)
	}
	if len(c.AllowedHeaders) == 0 {
		c.AllowedHeaders = defaultCORSHeaders
	}
}

// corsPolicy is a validated CORSConfig, ready for the request path.
type corsPolicy struct {
	anyOrigin bool
	origins   []string
	methods   string // joined, for Access-Control-Allow-Methods
	methodSet []string
	anyHeader bool
	headers   []string // lower case; a trailing * is a prefix
}

func newCORSPolicy(c *CORSConfig) *corsPolicy {
	if c == nil {
		return nil
	}
	p := &corsPolicy{methods: strings.Join(c.AllowedMethods, ", "), methodSet: c.AllowedMethods}
	for _, o := range c.AllowedOrigins {
		if o == "*" {
			p.anyOrigin = true
		}
		p.origins = append(p.origins, strings.ToLower(o))
	}
	for _, h := range c.AllowedHeaders {
		if h == "*" {
			p.anyHeader = true
		}
		p.headers = append(p.headers, strings.ToLower(h))
	}
	return p
}

func (p *corsPolicy) originAllowed(origin string) bool {
	return p.anyOrigin || slices.Contains(p.origins, strings.ToLower(origin))
}

func (p *corsPolicy) headerAllowed(h string) bool {
	h = strings.ToLower(strings.TrimSpace(h))
	if p.anyHeader || h == "" {
		return true
	}
	for _, a := range p.headers {
		if a == h || (strings.HasSuffix(a, "*") && strings.HasPrefix(h, strings.TrimSuffix(a, "*"))) {
			return true
		}
	}
	return false
}

// apply handles CORS for one request. A preflight (OPTIONS with
// Access-Control-Request-Method) is answered here, done = true: 204 with
// the grants when its origin, method and headers are allowed, else 403. Any
// other request from an allowed origin gets the headers that let its page
// read the answer, and goes on.
func (p *corsPolicy) apply(ctx *fasthttp.RequestCtx) (done bool) {
	origin := string(ctx.Request.Header.Peek("Origin"))
	if origin == "" {
		return false
	}
	preflight := isPreflight(ctx)
	allowed := p.originAllowed(origin)
	if !preflight {
		if allowed {
			p.grant(ctx, origin)
			ctx.Response.Header.Set("Access-Control-Expose-Headers", corsExposed)
		}
		return false
	}
	method := strings.ToUpper(string(ctx.Request.Header.Peek("Access-Control-Request-Method")))
	reqHeaders := string(ctx.Request.Header.Peek("Access-Control-Request-Headers"))
	why := ""
	switch {
	case !allowed:
		why = fmt.Sprintf("The origin %q may not call this gateway (server.cors.allowed_origins).", origin)
	case !slices.Contains(p.methodSet, method):
		why = fmt.Sprintf("The method %q is not allowed (server.cors.allowed_methods).", method)
	default:
		for _, h := range strings.Split(reqHeaders, ",") {
			if !p.headerAllowed(h) {
				why = fmt.Sprintf("The header %q is not allowed (server.cors.allowed_headers).", strings.TrimSpace(h))
				break
			}
		}
	}
	ctx.Response.Header.Add("Vary", "Origin, Access-Control-Request-Method, Access-Control-Request-Headers")
	if why != "" {
		(&apiError{status: 403, typ: typeInvalidRequest, code: "cors_forbidden", message: why}).write(ctx)
		return true
	}
	p.grant(ctx, origin)
	ctx.Response.Header.Set("Access-Control-Allow-Methods", p.methods)
	if reqHeaders != "" {
		ctx.Response.Header.Set("Access-Control-Allow-Headers", reqHeaders) // each checked above
	}
	ctx.Response.Header.Set("Access-Control-Max-Age", "600")
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	return true
}

// grant lets origin's pages read the answer. The origin is echoed, not
// "*", so that a page may send its Authorization header.
func (p *corsPolicy) grant(ctx *fasthttp.RequestCtx, origin string) {
	ctx.Response.Header.Set("Access-Control-Allow-Origin", origin)
	if !ctx.IsOptions() {
		ctx.Response.Header.Add("Vary", "Origin")
	}
}

// isPreflight says whether the request is a browser's CORS preflight.
func isPreflight(ctx *fasthttp.RequestCtx) bool {
	return ctx.IsOptions() && len(ctx.Request.Header.Peek("Origin")) > 0 &&
		len(ctx.Request.Header.Peek("Access-Control-Request-Method")) > 0
}

// refuseUnconfiguredPreflight answers a preflight with CORS off: a 405 for
// OPTIONS would leave the page's developer guessing, so the refusal says
// what to set.
func refuseUnconfiguredPreflight(ctx *fasthttp.RequestCtx) {
	(&apiError{status: 403, typ: typeInvalidRequest, code: "cors_forbidden",
		message: fmt.Sprintf("Browser pages from other origins may not call this gateway: CORS is off. "+
			"To allow %q, list it in server.cors.allowed_origins (in the demo: kvgate serve --cors-origin %s).",
			ctx.Request.Header.Peek("Origin"), ctx.Request.Header.Peek("Origin"))}).write(ctx)
}
