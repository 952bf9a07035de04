package gateway

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// The access log: one line per proxied request, written by its finish, so
// that every way a request leaves (answered, refused, shed, failed,
// cancelled) gives exactly one line. It goes through the gateway's logger
// (log.format: text or json) at info, with the message "request".
//
// It says who asked (request id, tenant), for what (route, model), where it
// ran (GPU, backend), how it ended (status, outcome, refusal reason), how
// long each part took (queue wait, time to first token, total), and what it
// cost (prompt and output tokens, KV bytes reserved). It never holds an API
// key, a prompt or an answer: only what the gateway decided and measured,
// and the client's X-Request-Id, for correlation with the client's logs.

// maxRequestID bounds the X-Request-Id a client sends as it is logged.
const maxRequestID = 128

// noteAccess keeps what the access line needs of the request itself, which
// is gone (or not the handler's to read) when a stream finishes. Nothing
// is kept with the access log off.
func (x *exchange) noteAccess(ctx *fasthttp.RequestCtx, route string) {
	if !x.rt.cfg.Log.access() {
		return
	}
	x.access.on, x.access.rc, x.access.route = true, ctx, route
	if id := ctx.Request.Header.Peek("X-Request-Id"); len(id) > 0 {
		x.access.id = string(id[:min(len(id), maxRequestID)])
	} else {
		x.access.id = strconv.FormatUint(ctx.ID(), 10)
	}
}

// accessRecord is an exchange's part of its access line.
type accessRecord struct {
	on    bool
	id    string
	route string
	// rc is read for the status of an answer the handler wrote: finish
	// runs on the handler's goroutine then. A stream's status is its 200.
	rc     *fasthttp.RequestCtx
	ttft   time.Duration // 0 until the first token
	waited time.Duration // in the queue, for a request refused after waiting
}

// logAccess writes the request's access line; finish calls it once.
func (x *exchange) logAccess(outcome, reason string, total time.Duration) {
	a := &x.access
	if !a.on || !x.s.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	status := 200
	switch {
	case x.body.x != nil: // a stream: its 200 went out with the first event
	case a.rc != nil && outcome == outcomeCanceled && len(a.rc.Response.Body()) == 0:
		status = 499 // nothing was answered: the client left (nginx's code for it)
	case a.rc != nil:
		status = a.rc.Response.StatusCode()
	}
	waited := a.waited
	gpu := ""
	if x.ticket != nil {
		waited = x.ticket.Waited()
		gpu = x.ticket.GPU()
		if g := x.rt.gpuByID[gpu]; g != nil {
			gpu = g.name
		}
	}
	backend := ""
	if x.backend != nil {
		backend = x.backend.Name()
	}
	prompt, output := x.predicted, 0
	if x.hasUsage {
		prompt, output = x.usage.prompt, x.usage.completion
	}
	x.s.log.LogAttrs(context.Background(), slog.LevelInfo, "request",
		slog.String("id", a.id),
		slog.String("tenant", x.tenant),
		slog.String("route", a.route),
		slog.String("model", x.label),
		slog.String("gpu", gpu),
		slog.String("backend", backend),
		slog.Int("status", status),
		slog.String("outcome", outcome),
		slog.String("reason", reason),
		slog.Float64("queue_wait_ms", ms(waited)),
		slog.Float64("ttft_ms", ms(a.ttft)),
		slog.Float64("duration_ms", ms(total)),
		slog.Int("prompt_tokens", prompt),
		slog.Int("output_tokens", output),
		slog.Int64("kv_reserved_bytes", x.res.weight()),
	)
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
