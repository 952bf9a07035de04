package gateway

import (
	"bufio"
	"context"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// lingerClose answers a request that fasthttp refused while its client may
// still be sending it (a body over server.max_body_bytes, headers over
// server.max_header_bytes), the way nginx's lingering close does.
//
// fasthttp writes such an answer and closes the connection at once, with
// the rest of the request unread. Closing a socket with unread input makes
// the kernel reset the connection, and a client still writing its body —
// any body larger than the socket buffers — gets the reset instead of the
// answer: the official SDKs then report a connection error and retry the
// same body. So the answer is written here, the sending side is shut (the
// client reads the answer, then end of stream), and what the client still
// sends is read and dropped until it closes its side, for at most
// server.read_timeout, or until the server shuts down. fasthttp's own
// write of the answer, which follows, fails on the shut side and is
// dropped; its close then finds nothing unread.
func (s *Server) lingerClose(ctx *fasthttp.RequestCtx, readTimeout time.Duration) {
	c := ctx.Conn()
	half, ok := c.(interface{ CloseWrite() error })
	if !ok {
		return // not TCP: fasthttp answers and closes as before
	}
	ctx.SetConnectionClose()
	ctx.Response.Header.SetServer(s.srv.Name)
	// A client that reads nothing cannot hold the write past the time it
	// had to send its request. Socket deadlines are the kernel's, on the
	// wall clock, whatever clock the gateway was given.
	if c.SetWriteDeadline(time.Now().Add(readTimeout)) != nil {
		return
	}
	w := bufio.NewWriterSize(c, 4096)
	if err := ctx.Response.Write(w); err != nil {
		return
	}
	if w.Flush() != nil || half.CloseWrite() != nil {
		return
	}
	drain(s.life.lingerCtx, c, readTimeout)
}

// drain reads c until it ends, fails, readTimeout passes or ctx ends. Its
// deadlines are the socket's, on the wall clock (time.Now), as the kernel
// keeps them.
func drain(ctx context.Context, c net.Conn, readTimeout time.Duration) {
	if c.SetReadDeadline(time.Now().Add(readTimeout)) != nil {
		return
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) }) // a deadline now: the blocked Read returns
	defer stop()
	buf := make([]byte, 32<<10)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}
