package gateway

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

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
