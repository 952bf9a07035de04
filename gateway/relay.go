package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"runtime/debug"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/backends"
)

// relay streams SSE events from the backend to the client as they arrive,
// starting with first (already read, to honour the first-byte timeout
// before the client was promised a 200): each event is flushed as soon as
// no further bytes are already buffered (so a burst goes out in one write,
// and a lone token at once). It counts tokens and finished choices on the
// way, returns each finished choice's KV at once, and drops the usage chunk
// the gateway asked for on the client's behalf.
//
// How the stream ends decides the outcome: [DONE] relayed is a success,
// whatever the client does after it; a stream that ends without [DONE],
// breaks, or sends an event past the size bound gets a final error event
// on its own line and is a failure. It runs after the handler has
// returned, while fasthttp writes the body (see sseBody), and must not
// touch the RequestCtx.
func (x *exchange) relay(w *bufio.Writer, resp *backends.Response, er *eventReader, first []byte) {
	outcome, reason := outcomeOK, ""
	done := false // [DONE] reached the client: nothing after changes the outcome
	defer func() {
		if p := recover(); p != nil {
			x.s.log.Error("panic relaying stream", "panic", p, "stack", string(debug.Stack()))
			outcome, reason = outcomeFailed, "internal"
		}
		if er != nil {
			er.release()
			resp.Release()
		}
		x.finish(outcome, reason)
	}()
	p := x.s.parsers.Get()
	defer x.s.parsers.Put(p)
	var shape tokenShape

	ev, err := first, error(nil)
	for {
		for ; err == nil; ev, err = er.next() {
			if !x.relayEvent(w, er, p, &shape, ev, &done, &outcome, &reason) {
				return
			}
		}
		if done || !x.preempted.Load() || x.rctx.Cause() != nil {
			break
		}
		// The guard stopped the stream to resume it (resume.go): the same
		// relay goes on with the continuation.
		er.release()
		resp.Release()
		var e *apiError
		resp, er, ev, e, outcome, reason = x.resumeStream()
		if e != nil {
			x.streamError(w, e)
			return
		}
		if er == nil {
			return
		}
		shape, err, x.merges = tokenShape{}, nil, nil // the continuation's backend may be another
	}
	if done {
		return // reading on was only to reuse the connection
	}
	// The stream ended without [DONE]: the client gets a final error event.
	if o, r, e := x.ended(); o != "" {
		outcome, reason = o, r
		if e != nil {
			x.streamError(w, e)
		}
		return
	}
	name := x.backend.Name()
	switch {
	case errors.Is(err, errEventTooLarge):
		outcome, reason = outcomeFailed, "upstream_event_too_large"
	case errors.Is(err, io.EOF), errors.Is(err, errStreamTruncated):
		outcome, reason = outcomeFailed, "upstream_incomplete"
		err = errStreamTruncated
	default:
		outcome, reason = outcomeFailed, "upstream_error"
	}
	x.s.m.upstreamErrors.WithLabelValues(name, "transport").Inc()
	x.s.log.Warn("backend stream ended badly", "backend", name, "err", err)
	x.streamError(w, &apiError{typ: typeServer, code: "upstream_error", message: upstreamProblem(name, err)})
}

// relayEvent relays one event and acts on it; false when the client is
// gone (outcome says so) and the relay must stop.
func (x *exchange) relayEvent(w *bufio.Writer, er *eventReader, p *fastjson.Parser, shape *tokenShape, ev []byte, done *bool, outcome, reason *string) bool {
	keep, failed, last, repl := x.inspect(p, shape, ev)
	if failed && !*done {
		*outcome, *reason = outcomeFailed, "backend_stream_error"
	}
	if repl != nil {
		ev = repl
	}
	if keep && !*done {
		if _, werr := w.Write(x.renameModel(ev)); werr != nil {
			x.clientGone()
			*outcome, *reason = outcomeCanceled, "client_disconnect"
			return false
		}
	}
	if !*done && !er.buffered() || last {
		if ferr := w.Flush(); ferr != nil && !*done {
			x.clientGone()
			*outcome, *reason = outcomeCanceled, "client_disconnect"
			return false
		}
		if last && !*done {
			*done = true
			x.relayedDone()
			// The backend has finished: its blocks are free already,
			// even if its side of the stream stays open a moment.
			x.ticket.Release()
		}
	}
	return true
}

// inspect reads one SSE event: token counts, finished choices, usage,
// errors. keep is false for the usage-only chunk the client did not ask for
// (and a continuation's opening role chunk: resume.go); last says the event
// is the stream's terminator, [DONE]; repl, when not nil, is the event to
// relay instead (a resumed stream's usage, told as one exchange's; a chunk
// without the usage the gateway asked for on the client's behalf). shape
// is the stream's, to tell its token events by.
func (x *exchange) inspect(p *fastjson.Parser, shape *tokenShape, ev []byte) (keep, failed, last bool, repl []byte) {
	data := sseData(ev)
	if data == nil {
		return true, false, false, nil
	}
	if string(data) == "[DONE]" {
		return true, false, true, nil
	}
	if x.req.kind.typedEvents() { // the Responses and Messages APIs (relay_responses.go)
		keep, failed, last = x.inspectTyped(p, ev)
		return keep, failed, last, nil
	}
	rs := x.resume
	if len(x.res.gen) == 1 {
		// About the only choice and nothing else: read without a parse,
		// the chunk's usage (the backend's count so far: tokencount.go)
		// cut off first.
		d, reported := data, -1
		if cut, n, ok := cutUsage(data, x.cutBuf); ok {
			x.cutBuf, d, reported = cut, cut, n
		}
		if c, ok := shape.choice0(d); ok {
			if c.text {
				if rs.capturing() {
					rs.capture(d[c.start+1:c.end-1], c.reasoning)
				}
				x.token(0, textBytes(d[c.start+1:c.end-1]), reported)
			} else if reported >= 0 {
				x.token(0, 0, reported)
			}
			if c.finish != nil {
				x.finished(0, string(c.finish) == "length")
			}
			if reported >= 0 && !x.req.continuousUsage {
				repl = x.sseEvent(d)
			}
			if rs != nil && rs.opening {
				rs.opening = false
				return c.text || c.finish != nil, false, false, repl
			}
			return true, false, false, repl
		}
	}
	v, err := p.ParseBytes(data)
	if err != nil {
		return true, false, false, nil
	}
	if rs != nil {
		rs.opening = false
	}
	if e := v.Get("error"); e != nil {
		if bytes.Contains(e.GetStringBytes("message"), outOfMemory) {
			x.overflowed()
		}
		return true, true, false, nil
	}
	choices := v.GetArray("choices")
	reported := -1
	if u := v.Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
		if len(choices) > 0 {
			// A chunk's own usage: its choice's tokens so far.
			if n := u.Get("completion_tokens"); n != nil && len(choices) == 1 {
				reported = max(n.GetInt(), 0)
			}
			if !x.req.continuousUsage {
				v.Del("usage")
				repl = x.sseEvent(v.MarshalTo(x.cutBuf[:0]))
			}
		} else {
			x.readUsage(u)
			if rs != nil && rs.carried > 0 && x.req.includeUsage {
				repl = resumedUsage(v, u, x.usage.prompt, x.usage.completion)
			}
		}
	}
	for _, c := range choices {
		idx := c.GetInt("index")
		if n := generatedBytes(c); n > 0 {
			if idx == 0 && rs.capturing() {
				rs.captureParsed(c)
			}
			x.token(idx, n, reported)
		} else if reported >= 0 {
			x.token(idx, 0, reported)
		}
		if fr := c.Get("finish_reason"); fr != nil && fr.Type() == fastjson.TypeString {
			x.finished(idx, string(fr.GetStringBytes()) == "length")
		}
	}
	if len(choices) == 0 && x.hasUsage && !x.req.includeUsage {
		return false, false, false, nil
	}
	return true, false, false, repl
}

// sseEvent is data as an event of its own, built in the exchange's
// buffer (valid until the next): a chunk relayed with what the client did
// not ask for cut out.
func (x *exchange) sseEvent(data []byte) []byte {
	x.eventBuf = append(append(append(x.eventBuf[:0], "data: "...), data...), "\n\n"...)
	return x.eventBuf
}

// writeStreamError ends a stream that has already begun with an error event,
// the way vLLM reports errors mid-stream. Every event before it ended with
// its blank line, so the error stands on its own line.
func writeStreamError(w *bufio.Writer, e *apiError) {
	w.WriteString("data: ")
	w.Write(e.appendJSON(nil, false))
	w.WriteString("\n\ndata: [DONE]\n\n")
	w.Flush()
}

// sseData is the payload of an event's data line(s); nil for comments and
// events without data.
func sseData(ev []byte) []byte {
	var out []byte
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		line = bytes.TrimRight(line, "\r")
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			d = bytes.TrimPrefix(d, []byte(" "))
			if out != nil {
				out = append(append(append([]byte(nil), out...), '\n'), d...)
			} else {
				out = d
			}
		}
	}
	return out
}

// The stages of an exchange, as hangUp reads them.
const (
	stageBefore int32 = iota // no stream under way
	stageStreaming
	stageDone // [DONE] reached the client
)

// hangUp is the watch's report that the client hung up — or only shut its
// sending side: the kernel tells the two apart only once we write. While a
// stream is under way the relay's writes tell, within an event or two, so
// the report is kept for later rather than cutting off a client that still
// reads (HTTP/1.1 allows a half-close); once [DONE] has gone out nothing is
// written any more, and the report ends the request, as it does before the
// stream. Each side writes its own flag before it reads the other's, so a
// report that races [DONE] is acted on by one of them.
func (x *exchange) hangUp() {
	if x.stage.Load() != stageStreaming {
		x.clientGone()
		return
	}
	x.hungUp.Store(true)
	if x.stage.Load() != stageStreaming {
		x.clientGone()
	}
}

// relayedDone marks [DONE] as relayed, and ends the request if the client
// was reported gone during the stream.
func (x *exchange) relayedDone() {
	x.stage.Store(stageDone)
	if x.hungUp.Load() {
		x.clientGone()
	}
}
