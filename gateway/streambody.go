package gateway

import (
	"bufio"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

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
