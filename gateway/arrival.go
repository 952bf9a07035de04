package gateway

import (
	"bytes"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// What a request meets at the door, in order: the connection limit (a
// connection opened past server.max_connections is refused before its
// request is read), its request id, CORS for a browser's preflight, and
// its key, which names its tenant and so the highest class it may ask for.

// connLimit enforces server.max_connections in the handler rather than
// through fasthttp's Concurrency alone. fasthttp refuses a connection past
// Concurrency before reading it, with a plain-text 503 and no Retry-After,
// and refuses probes the same way: an orchestrator would then restart a
// gateway that is merely busy. So fasthttp's limit is set above this one
// (probeHeadroom), and a connection opened past this limit is read: a probe
// (/healthz, /readyz, /health) is answered as usual, anything else gets an
// OpenAI-shaped 503 with Retry-After and the connection is closed.
//
// Only connections past the limit are refused, never one opened under it:
// fasthttp's ConnState reports each connection's opening and end, in order
// for one connection, so the count at opening decides.
type connLimit struct {
	limit int64
	open  atomic.Int64
	nOver atomic.Int64 // entries in over: the hot path skips the map while 0
	over  sync.Map     // net.Conn → struct{}: opened past the limit
}

// refusedRetryAfter is what a refused client is told to wait: connections
// turn over in well under a second when the gateway is merely busy.
const refusedRetryAfter = time.Second

// probeHeadroom is how many connections past max_connections fasthttp
// still serves, to answer probes and refuse the rest politely: a quarter
// of the limit, at least 64.
func probeHeadroom(limit int) int { return max(64, limit/4) }

// state is fasthttp's ConnState hook.
func (l *connLimit) state(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		if l.open.Add(1) > l.limit {
			l.over.Store(c, struct{}{})
			l.nOver.Add(1)
		}
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		l.open.Add(-1)
		if l.nOver.Load() > 0 {
			if _, ok := l.over.LoadAndDelete(c); ok {
				l.nOver.Add(-1)
			}
		}
	}
}

// past says whether c was opened past the limit.
func (l *connLimit) past(c net.Conn) bool {
	if l.nOver.Load() == 0 {
		return false
	}
	_, ok := l.over.Load(c)
	return ok
}

// refuse answers a request on a connection past the limit, and closes it.
func (l *connLimit) refuse(ctx *fasthttp.RequestCtx) {
	(&apiError{status: 503, typ: typeServer, code: "too_many_connections", retryAfter: refusedRetryAfter,
		message: fmt.Sprintf("The gateway is serving its maximum of %d connections; retry after %s.", l.limit, retryAfterText(refusedRetryAfter))}).write(ctx)
	ctx.SetConnectionClose()
}

// isProbe says whether path is a health or readiness probe, answered past
// the limit.
func isProbe(path []byte) bool {
	switch string(path) {
	case "/healthz", "/readyz", "/health":
		return true
	}
	return false
}

// Request ids: every answer carries X-Request-Id, and the access line, the
// span and the backend (vLLM takes the header as its own request id) carry
// the same, so that a client's id finds its request in the operator's log
// and the backend's. A client's id is kept when it is sane — 1 to
// maxRequestID visible ASCII bytes, as Envoy and nginx expect of the
// header — and replaced otherwise, so that nothing a client sends is
// logged raw; a request without one gets a random (version 4) UUID, unique
// across replicas and restarts where a counter is not.

const (
	headerRequestID = "X-Request-Id"
	// maxRequestID bounds a client's X-Request-Id.
	maxRequestID = 128
)

// stampRequestID makes the request's X-Request-Id the one the gateway uses
// and puts it on the answer. It runs before routing, so every answer and
// refusal carries it; an error's reset of the answer keeps it (errors.go).
func stampRequestID(ctx *fasthttp.RequestCtx) {
	id := ctx.Request.Header.Peek(headerRequestID)
	if !saneRequestID(id) {
		var b [36]byte
		id = appendUUID(b[:0])
		ctx.Request.Header.SetBytesV(headerRequestID, id)
	}
	ctx.Response.Header.SetBytesV(headerRequestID, id)
}

// saneRequestID says whether a client's id may be kept as it is.
func saneRequestID(id []byte) bool {
	if len(id) == 0 || len(id) > maxRequestID {
		return false
	}
	for _, c := range id {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// appendUUID appends a random version 4 UUID. math/rand/v2's generator is
// seeded from the system's entropy and is per-thread: no lock, no syscall.
func appendUUID(dst []byte) []byte {
	var u [16]byte
	hi, lo := rand.Uint64(), rand.Uint64()
	for i := range 8 {
		u[i], u[8+i] = byte(hi>>(56-8*i)), byte(lo>>(56-8*i))
	}
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], u[10:16])
	return append(dst, s[:]...)
}

// CORS, for browser apps that call the gateway directly (vLLM's
// --allowed-origins, --allowed-methods, --allowed-headers are the model).
// Off unless server.cors is configured: a gateway is usually called by
// servers, and a browser calling it holds an API key the page exposes.

// corsExposed are the answer's headers a page's script may read: what
// tells it when to retry and which request it was. (The allowed methods
// and headers' defaults are configdefaults.go's.)
const corsExposed = "Retry-After, Retry-After-Ms, X-Should-Retry, X-Request-Id, X-Kvgate-Backend, X-Kvgate-Queue-Ms"

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

// authenticate finds the tenant of a request. With no keys configured every
// request is anonymous (nil tenant).
func (rt *runtime) authenticate(ctx *fasthttp.RequestCtx) (*tenant, bool) {
	if !rt.auth {
		return nil, true
	}
	key := bearer(ctx)
	if key == nil {
		return nil, false
	}
	t := rt.tenants[string(key)]
	return t, t != nil
}

// bearer is the key of an Authorization: Bearer header, nil without one.
func bearer(ctx *fasthttp.RequestCtx) []byte {
	auth := ctx.Request.Header.Peek("Authorization")
	if len(auth) < 7 || !bytes.EqualFold(auth[:7], []byte("bearer ")) {
		return nil
	}
	return bytes.TrimSpace(auth[7:])
}

// adminAllowed says whether a request may read an operator's view: always
// without admin keys, else only with one of them. Keys are compared in
// constant time.
func (rt *runtime) adminAllowed(ctx *fasthttp.RequestCtx) bool {
	keys := rt.cfg.Admin.APIKeys
	if len(keys) == 0 {
		return true
	}
	got := bearer(ctx)
	ok := 0
	for _, k := range keys {
		ok |= subtle.ConstantTimeCompare(got, []byte(k))
	}
	return ok == 1
}

func unauthorized() *apiError {
	return &apiError{status: 401, typ: typeAuthentication, code: "invalid_api_key",
		message: "Incorrect or missing API key. Send it as: Authorization: Bearer <key>."}
}

// classFor picks the admission class of a request: the tenant's class, or
// a lower one the client asked for in the priority header. A request never
// rises above its tenant's class.
func (rt *runtime) classFor(t *tenant, asked []byte) (string, error) {
	own := rt.cfg.Admission.DefaultClass
	if t != nil {
		own = t.class
	}
	if len(asked) == 0 {
		return own, nil
	}
	rank, ok := rt.classRank[string(asked)]
	if !ok {
		return "", fmt.Errorf("unknown priority class %q", asked)
	}
	if t == nil && !rt.auth {
		return string(asked), nil // no tenants: clients are trusted to choose
	}
	if rank < rt.classRank[own] {
		return own, nil
	}
	return string(asked), nil
}
