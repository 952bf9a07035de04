package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/internal/chunkscan"
	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/kvgate/kvgate/internal/sse"
)

// stream relays a streamed answer to the client, the loop's turns after
// the first included: the events of each upstream are relayed as they
// arrive (relay.events), and when an upstream ends because the guard
// stopped it to resume it, the continuation takes the loop's next turn
// (resume.go) and its events follow on the same stream.
//
// How the stream ends decides the outcome: [DONE] relayed is a success,
// whatever the client does after it; a stream that ends without [DONE],
// breaks, or sends an event past the size bound gets a final error event
// on its own line and is a failure. It runs after the handler has
// returned, while fasthttp writes the body (see sseBody), and must not
// touch the RequestCtx.
func (x *exchange) stream(w *bufio.Writer, up upstream) {
	r := &x.relay
	r.x, r.w, r.p, r.outcome = x, w, x.s.parsers.Get(), outcomeOK
	defer func() {
		if p := recover(); p != nil {
			x.s.log.Error("panic relaying stream", "panic", p, "stack", string(debug.Stack()))
			r.outcome, r.reason = outcomeFailed, "internal"
		}
		up.release()
		x.s.parsers.Put(r.p)
		x.finish(r.outcome, r.reason)
	}()
	for {
		err := r.events(&up)
		up.release()
		switch {
		case r.gone || r.relayed: // reading on after [DONE] was only to reuse the connection
			return
		case !x.rctx.stopped() || x.rctx.Cause() != nil:
			r.end(err)
			return
		}
		// The guard stopped the stream to resume it: the loop's next turn.
		if up, err = x.resumeTurn(); err != nil {
			r.fail(x.failure(err))
			return
		}
	}
}

// relay is an exchange's stream: the body fasthttp writes, each
// upstream's events written to the client, flushed as soon as no further
// bytes are already buffered (so a burst goes out in one write, and a
// lone token at once), counted on the way (inspect), the usage chunk the
// gateway asked for on the client's behalf dropped; the stage a hang-up
// report is read by, and what a stopped stream is resumed from.
type relay struct {
	body      sseBody // a streamed answer, relayed as fasthttp writes it
	streaming bool    // the relay owns finish (set by the handler's goroutine only)
	// stage lets a stream under way outlive a hang-up report (see
	// hangUp); the watch's goroutine reads and writes it too.
	stage atomic.Int32 // stageBefore, stageStreaming, stageHungUp or stageDone
	// resume keeps what a stream needs to be resumed after the guard
	// stops it (resume.go); nil when it cannot be.
	resume *resumeState
	// cutBuf and eventBuf hold a chunk with its usage cut, and the event
	// relayed in its place.
	cutBuf, eventBuf []byte

	// While the stream is written (stream):
	x       *exchange
	w       *bufio.Writer
	p       *fastjson.Parser
	shape   chunkscan.Shape // the upstream's, to tell its token events by
	relayed bool            // [DONE] reached the client: nothing after changes the outcome
	gone    bool            // the client is gone: the relay stops
	// outcome and reason are the request's, as finish records them.
	outcome, reason string
}

// events relays an upstream's events, from its first, until its stream
// ends or the client is gone; the error is the stream's end.
func (r *relay) events(up *upstream) error {
	r.shape, r.x.merges = chunkscan.Shape{}, nil // each upstream's backend may be another
	ev, err := up.first, error(nil)
	for ; err == nil; ev, err = up.er.Next() {
		if !r.event(ev, up.er.Buffered()) {
			return nil
		}
	}
	return err
}

// event relays one event and acts on it; false when the client is gone
// and the relay must stop. more says further bytes are buffered already.
func (r *relay) event(ev []byte, more bool) bool {
	x := r.x
	keep, failed, last, repl := x.inspect(r.p, &r.shape, ev)
	if failed && !r.relayed {
		r.outcome, r.reason = outcomeFailed, "backend_stream_error"
	}
	if repl != nil {
		ev = repl
	}
	if keep && !r.relayed {
		if _, err := r.w.Write(x.renameModel(ev)); err != nil {
			return r.hungUp()
		}
	}
	if !r.relayed && !more || last {
		if err := r.w.Flush(); err != nil && !r.relayed {
			return r.hungUp()
		}
		if last && !r.relayed {
			r.relayed = true
			x.relayedDone()
			// The backend has finished: its blocks are free already,
			// even if its side of the stream stays open a moment.
			x.ticket.Release()
		}
	}
	return true
}

// hungUp ends the request of a client a write failed to.
func (r *relay) hungUp() bool {
	r.x.clientGone()
	r.gone, r.outcome, r.reason = true, outcomeCanceled, "client_disconnect"
	return false
}

// end ends a stream that ended without [DONE]: the client gets a final
// error event, which says why.
func (r *relay) end(err error) {
	if errors.Is(err, io.EOF) {
		err = sse.ErrTruncated
	}
	e, outcome, reason := r.x.failure(err)
	if reason == "upstream_error" {
		switch {
		case errors.Is(err, sse.ErrTooLarge):
			reason = "upstream_event_too_large"
		case errors.Is(err, sse.ErrTruncated):
			reason = "upstream_incomplete"
		}
	}
	r.fail(e, outcome, reason)
}

// fail ends the stream with e's error event (none when e is nil: nobody
// is left to read it) and the outcome.
func (r *relay) fail(e *apiError, outcome, reason string) {
	r.outcome, r.reason = outcome, reason
	if e != nil {
		r.x.streamError(r.w, e)
	}
}

// inspect reads one SSE event: token counts, finished choices, usage,
// errors. keep is false for the usage-only chunk the client did not ask for
// (and a continuation's opening role chunk: resume.go); last says the event
// is the stream's terminator, [DONE]; repl, when not nil, is the event to
// relay instead (a resumed stream's usage, told as one exchange's; a chunk
// without the usage the gateway asked for on the client's behalf). shape
// is the stream's, to tell its token events by.
func (x *exchange) inspect(p *fastjson.Parser, shape *chunkscan.Shape, ev []byte) (keep, failed, last bool, repl []byte) {
	data := sse.Data(ev)
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
	if len(x.res.gen) == 1 {
		if keep, repl, ok := x.inspectOnly(shape, data); ok {
			return keep, false, false, repl
		}
	}
	v, err := p.ParseBytes(data)
	if err != nil {
		return true, false, false, nil
	}
	if x.resume != nil {
		x.resume.opening = false
	}
	if e := v.Get("error"); e != nil {
		if bytes.Contains(e.GetStringBytes("message"), outOfMemory) {
			x.overflowed()
		}
		return true, true, false, nil
	}
	keep, repl = x.inspectChunk(v)
	return keep, false, false, repl
}

// inspectOnly reads a chunk about the only choice and nothing else without
// a parse, the chunk's usage (the backend's count so far: tally.go)
// cut off first; ok is false for a chunk it cannot read so.
func (x *exchange) inspectOnly(shape *chunkscan.Shape, data []byte) (keep bool, repl []byte, ok bool) {
	rs := x.resume
	d, reported := data, -1
	if cut, n, ok := cutUsage(data, x.cutBuf); ok {
		x.cutBuf, d, reported = cut, cut, n
	}
	c, ok := shape.Choice0(d)
	if !ok {
		return false, nil, false
	}
	if c.Text {
		if rs.capturing() {
			rs.capture(d[c.Start+1:c.End-1], c.Reasoning)
		}
		x.token(0, textBytes(d[c.Start+1:c.End-1]), reported)
	} else if reported >= 0 {
		x.token(0, 0, reported)
	}
	if c.Finish != nil {
		x.finished(0, string(c.Finish) == "length")
	}
	if reported >= 0 && !x.req.continuousUsage {
		repl = x.sseEvent(d)
	}
	if rs != nil && rs.opening {
		// A continuation's opening role chunk is not relayed again.
		rs.opening = false
		return c.Text || c.Finish != nil, repl, true
	}
	return true, repl, true
}

// inspectChunk reads a parsed chunk: its choices' tokens and ends, and
// its usage — a chunk's own, cut when the client did not ask for it, or
// the stream's at its end.
func (x *exchange) inspectChunk(v *fastjson.Value) (keep bool, repl []byte) {
	rs := x.resume
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
		return false, nil
	}
	return true, repl
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

// The stages of an exchange, as hangUp reads them.
const (
	stageBefore    int32 = iota // no stream under way
	stageStreaming              // a stream under way
	stageHungUp                 // a stream under way, its client reported gone
	stageDone                   // [DONE] reached the client
)

// hangUp is the watch's report that the client hung up — or only shut its
// sending side: the kernel tells the two apart only once we write. While a
// stream is under way the relay's writes tell, within an event or two, so
// the report is kept for later rather than cutting off a client that still
// reads (HTTP/1.1 allows a half-close); once [DONE] has gone out nothing is
// written any more, and the report ends the request, as it does before the
// stream. The stage is one atomic, so a report that races [DONE] is acted
// on by exactly one of them.
func (x *exchange) hangUp() {
	for {
		switch st := x.stage.Load(); st {
		case stageHungUp:
			return
		case stageStreaming:
			if x.stage.CompareAndSwap(st, stageHungUp) {
				return
			}
		default:
			x.clientGone()
			return
		}
	}
}

// relayedDone marks [DONE] as relayed, and ends the request if the client
// was reported gone during the stream.
func (x *exchange) relayedDone() {
	if x.stage.Swap(stageDone) == stageHungUp {
		x.clientGone()
	}
}

// sseBody is a streamed answer as fasthttp writes it. fasthttp's
// SetBodyStreamWriter runs the writer in a goroutine of its own that feeds
// a pipe, which the connection's goroutine copies to the client: two
// goroutine hand-offs and a copy per event. sseBody instead lets fasthttp
// call WriteTo on the connection's goroutine (fasthttp.BodyWriterTo), where
// every flush of the relay's writer is one chunk on the wire. The relay
// itself — what is kept, when it flushes, how the exchange finishes — is
// the same either way.
//
// Exactly one of WriteTo, Read (a fallback should fasthttp ever read the
// body instead) or Close starts the relay or, when the body is never
// written (the client went away before the headers), finishes the exchange.
type sseBody struct {
	x       *exchange
	up      upstream // the stream, its first event already read
	started bool
	pipe    io.ReadCloser // the fallback's pipe, once Read was called
}

var (
	_ fasthttp.BodyWriterTo = (*sseBody)(nil)
	_ io.ReadCloser         = (*sseBody)(nil)
)

// sseWriters buffer events between flushes, as fasthttp's own stream
// writers do.
var sseWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4096) }}

func (b *sseBody) SupportsBodyWriteTo() bool { return true }

// WriteTo runs the relay; w frames each write as one chunk and flushes it.
func (b *sseBody) WriteTo(w io.Writer) (int64, error) {
	if b.started {
		return 0, io.ErrClosedPipe
	}
	b.started = true
	cw := &countWriter{w: w}
	b.x.access.sent = cw // the access line's bytes_out
	bw := sseWriters.Get().(*bufio.Writer)
	bw.Reset(cw)
	b.x.stream(bw, b.up)
	bw.Reset(nil)
	sseWriters.Put(bw)
	return cw.n, nil // a failed write was the relay's to handle (the client went away)
}

func (b *sseBody) Read(p []byte) (int, error) {
	if b.pipe == nil {
		if b.started {
			return 0, io.ErrClosedPipe
		}
		b.started = true
		b.pipe = fasthttp.NewStreamReader(func(w *bufio.Writer) { b.x.stream(w, b.up) })
	}
	return b.pipe.Read(p)
}

// closeDelimited relays the stream to an HTTP/1.0 client, which cannot
// read chunked transfer coding (RFC 9112 §6.1): the answer has no length
// and ends when the connection closes. fasthttp frames every body stream of
// unknown length as chunks, so the connection is hijacked and the head and
// events are written to it here; fasthttp closes it after. The hijacked
// connection has no deadline of fasthttp's, so writeTimeout bounds the
// writes as fasthttp's would.
func (b *sseBody) closeDelimited(ctx *fasthttp.RequestCtx, writeTimeout time.Duration) {
	ctx.Response.Header.SetContentLength(-2) // neither Content-Length nor Transfer-Encoding; Connection: close
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		if c.SetWriteDeadline(time.Now().Add(writeTimeout)) != nil { // a socket deadline is on wall time, not the server's clock
			_ = b.Close()
			return
		}
		if _, err := c.Write(ctx.Response.Header.Header()); err != nil {
			_ = b.Close()
			return
		}
		_, _ = b.WriteTo(c)
	})
}

// Close ends the body after fasthttp wrote it, or instead of writing it.
func (b *sseBody) Close() error {
	switch {
	case b.pipe != nil:
		return b.pipe.Close() // the relay's next write fails and it finishes
	case !b.started:
		b.started = true
		b.up.release()
		b.x.finish(outcomeCanceled, "client_disconnect")
	}
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// resumeState is what a stream that may be resumed keeps as the relay
// passes its events on: the body and headers its backend was sent, and
// the text its only choice generated. resume.go makes the continuation of
// it if the guard stops the stream.
type resumeState struct {
	sent *bytebufferpool.ByteBuffer // the body, then the copied headers
	hdr  [len(forwardedHeaders)][2]int
	// text is the generated text as the events carried it: the contents of
	// JSON strings, escapes and all, one after another.
	text    *bytebufferpool.ByteBuffer
	broken  bool // something was generated that the text cannot carry
	resumed bool // sent again already: never twice
	// lost is broken or resumed as the guard reads it (Resumable), from
	// another goroutine.
	lost atomic.Bool
	// carried is the tokens the earlier exchange generated, which the
	// continuation's backend counts as prompt: the usage the client is
	// told moves them back to the completion.
	carried int
	// opening: the continuation's first event is still to come; the role
	// chunk that opens a chat stream is not relayed a second time.
	opening bool
}

var (
	sentBufs bytebufferpool.Pool
	textBufs bytebufferpool.Pool
)

func newResumeState() *resumeState {
	return &resumeState{sent: sentBufs.Get(), text: textBufs.Get()}
}

// free gives the buffers back; the state is unusable after.
func (rs *resumeState) free() {
	if rs.sent != nil {
		sentBufs.Put(rs.sent)
		textBufs.Put(rs.text)
		rs.sent, rs.text = nil, nil
	}
}

// keep copies the body the backend is sent and the client's headers it
// is sent with: the continuation is sent after the handler has returned,
// when the client's request may no longer be read.
func (rs *resumeState) keep(body []byte, hdr headerSource) {
	rs.sent.B = append(rs.sent.B[:0], body...)
	for i, h := range forwardedHeaders {
		start := len(rs.sent.B)
		rs.sent.B = append(rs.sent.B, hdr.Peek(h)...)
		rs.hdr[i] = [2]int{start, len(rs.sent.B)}
	}
}

// Peek is the copy of a forwarded header (headerSource).
func (rs *resumeState) Peek(key string) []byte {
	for i, h := range forwardedHeaders {
		if h == key {
			return rs.sent.B[rs.hdr[i][0]:rs.hdr[i][1]]
		}
	}
	return nil
}

// body is the body the backend was sent.
func (rs *resumeState) body() []byte {
	if len(forwardedHeaders) == 0 {
		return rs.sent.B
	}
	return rs.sent.B[:rs.hdr[0][0]]
}

// capturing says the generated text is still being kept.
func (rs *resumeState) capturing() bool { return rs != nil && !rs.resumed && !rs.broken }

// capture keeps a piece of generated text, as the contents of a JSON
// string (escapes kept); reasoning pieces cannot be continued as text.
func (rs *resumeState) capture(escaped []byte, reasoning bool) {
	if reasoning {
		rs.breaks()
		return
	}
	rs.text.B = append(rs.text.B, escaped...)
}

// breaks notes that the text can no longer carry what was generated.
func (rs *resumeState) breaks() {
	rs.broken = true
	rs.lost.Store(true)
}

// captureParsed keeps the text of choice 0 of a parsed event, which the
// scan could not read (generated says it carries output).
func (rs *resumeState) captureParsed(c *fastjson.Value) {
	d := c.Get("delta")
	if d != nil && (len(d.GetArray("tool_calls")) > 0 || len(d.GetStringBytes("reasoning")) > 0 || len(d.GetStringBytes("reasoning_content")) > 0) {
		rs.breaks()
		return
	}
	text := c.GetStringBytes("text")
	if d != nil {
		text = d.GetStringBytes("content")
	}
	n := len(rs.text.B)
	rs.text.B = jsonscan.AppendString(rs.text.B, string(text))
	// AppendString quotes; the text is kept without them.
	rs.text.B = append(rs.text.B[:n], rs.text.B[n+1:len(rs.text.B)-1]...)
}
