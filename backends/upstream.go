package backends

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httputil"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sync/semaphore"
)

// Upstream sends requests to one backend over a pool of keep-alive
// connections (a fasthttp.HostClient used as the pool) and owns each
// connection for the whole exchange. Owning it is the point: cancelling the
// request's context closes the connection at any moment — while writing,
// while the backend has not answered yet, or mid-stream — and a closed
// connection is how vLLM learns to abort a request and free its KV blocks.
// fasthttp's own client cannot be cancelled while it waits for headers.
type Upstream struct {
	hc *fasthttp.HostClient
	// slots bounds the connections in use; waiting for one honours the
	// request's context (HostClient's own wait cannot be cancelled).
	slots   *semaphore.Weighted
	maxBody int64
}

// UpstreamOptions tunes an Upstream; zero values take the documented
// defaults.
type UpstreamOptions struct {
	MaxConns    int           // connections to the backend; 0 = 1024
	DialTimeout time.Duration // 0 = 3s
	// MaxIdleConn closes pooled connections idle this long; 0 = 4s, under
	// the 5 s keep-alive of uvicorn (vLLM's server), so the gateway rarely
	// holds a connection the backend has already dropped.
	MaxIdleConn  time.Duration
	MaxBodyBytes int64 // largest non-streamed response read into memory; 0 = 64 MiB
	// TLS, when set, wraps every connection in a TLS client handshake
	// completed within DialTimeout, before the connection carries anything.
	// nil = plain HTTP.
	TLS            *tls.Config
	DialForTesting func(addr string) (net.Conn, error)
}

// NewUpstream makes an Upstream for the backend at addr ("host:port").
func NewUpstream(addr string, o UpstreamOptions) *Upstream {
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 3 * time.Second
	}
	if o.MaxIdleConn <= 0 {
		o.MaxIdleConn = 4 * time.Second
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 64 << 20
	}
	dial := o.DialForTesting
	if dial == nil {
		d := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}
		dial = func(addr string) (net.Conn, error) {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			return keepFD(c), nil
		}
	}
	if o.TLS != nil {
		dial = tlsDial(dial, o.TLS, o.DialTimeout)
	}
	return &Upstream{
		hc: &fasthttp.HostClient{
			Addr:                addr,
			MaxConns:            o.MaxConns,
			MaxIdleConnDuration: o.MaxIdleConn,
			Dial:                dial,
			// slots admits at most MaxConns exchanges, so the HostClient
			// always has room; this wait is only a safety net.
			MaxConnWaitTimeout: time.Second,
			// A 4k-token prompt is about 16 KiB: with fasthttp's default
			// 4 KiB buffers it took several system calls each way. The
			// buffers are pooled per exchange, not held per connection.
			ReadBufferSize:  16 << 10,
			WriteBufferSize: 16 << 10,
		},
		slots:   semaphore.NewWeighted(int64(o.MaxConns)),
		maxBody: o.MaxBodyBytes,
	}
}

// ErrUpstream marks a transport failure talking to the backend (refused,
// reset, malformed answer), as opposed to the backend's own error status.
var ErrUpstream = errors.New("upstream transport error")

// ErrConnect marks, within ErrUpstream, a failure to open a connection to
// the backend: nothing of the request was involved, so it says something
// about the backend alone.
var ErrConnect = errors.New("cannot connect")

// Response is a backend's answer whose body is read as it arrives. Exactly
// one goroutine reads and closes it; cancel the context given to Do to
// interrupt a blocked Read from elsewhere.
type Response struct {
	Header fasthttp.ResponseHeader

	body   io.Reader
	eof    bool
	closed bool
	// release gives the exchange's connection back to the pool (reuse) or
	// closes it, and frees its reader and slot.
	release func(reuse bool)
	slots   *semaphore.Weighted // the slot to give back on Close
	br      *bufio.Reader       // the connection's reader, once the request is written
	watch   interruptWatch
	// The body's framing, kept here rather than allocated per answer.
	sized   sizedBody
	chunked chunkedBody
}

// Interrupter is a context that closes an exchange's connection itself the
// moment it ends, which costs nothing per exchange where context.AfterFunc
// allocates (the gateway's request contexts are Interrupters).
type Interrupter interface {
	context.Context
	// Interrupt has c closed when the context ends, at once if it has
	// ended. One connection is held at a time.
	Interrupt(c io.Closer)
	// Uninterrupt forgets the connection; false if the context ended
	// first, which closed it.
	Uninterrupt() bool
}

// interruptWatch closes an exchange's connection when its context ends,
// through the context's Interrupter or else context.AfterFunc.
type interruptWatch struct {
	ic   Interrupter
	stop func() bool
	// interrupted is the AfterFunc's, allocated apart from the Response:
	// an AfterFunc that has started may still be running when the
	// Response is recycled for another exchange.
	interrupted *atomic.Bool
}

func (w *interruptWatch) start(ctx context.Context, conn net.Conn) {
	if ic, ok := ctx.(Interrupter); ok {
		w.ic = ic
		ic.Interrupt(conn)
		return
	}
	interrupted := new(atomic.Bool)
	w.interrupted = interrupted
	w.stop = context.AfterFunc(ctx, func() {
		interrupted.Store(true)
		conn.Close()
	})
}

// end stops watching; false if the context ended and closed the
// connection (or is closing it).
func (w *interruptWatch) end() bool {
	if w.ic != nil {
		return w.ic.Uninterrupt()
	}
	return w.stop() && !w.interrupted.Load()
}

// Status is the HTTP status code.
func (r *Response) Status() int { return r.Header.StatusCode() }

// IsEventStream says whether the body is SSE.
func (r *Response) IsEventStream() bool {
	return bytes.HasPrefix(r.Header.ContentType(), []byte("text/event-stream"))
}

// Read reads the body.
func (r *Response) Read(p []byte) (int, error) {
	if r.closed {
		return 0, io.ErrClosedPipe
	}
	n, err := r.body.Read(p)
	if errors.Is(err, io.EOF) {
		r.eof = true
	} else if err != nil {
		err = fmt.Errorf("%w: read body: %w", ErrUpstream, err)
	}
	return n, err
}

// Close gives the connection back to the pool if the body was read to its
// end, and closes it otherwise (which aborts the request upstream).
func (r *Response) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.release(r.eof && !r.Header.ConnectionClose())
	r.release = nil
	r.slots.Release(1)
}

// responses recycles Responses: a fresh one's header allocates its
// buffers on every answer, about a third of what a proxied request
// allocates.
var responses = sync.Pool{New: func() any { return new(Response) }}

// Release gives r back for another exchange once its caller is done with
// it, headers included, closing it first if it is open. r must not be used
// after, and Release is called at most once; a Response never released is
// only garbage, not a leak.
func (r *Response) Release() {
	r.Close()
	r.recycle()
}

func (r *Response) recycle() {
	r.Header.Reset()
	r.body, r.eof, r.closed, r.release, r.slots = nil, false, false, nil, nil
	r.watch = interruptWatch{}
	r.sized, r.chunked = sizedBody{}, chunkedBody{}
	responses.Put(r)
}

// ReadAll reads the whole body, refusing more than max bytes, and closes
// the response.
func (r *Response) ReadAll(max int64) ([]byte, error) {
	b, err := r.ReadInto(nil, max)
	if err != nil && int64(len(b)) > max {
		return nil, err
	}
	return b, err
}

// ReadInto appends the whole body to dst (a buffer the caller reuses),
// refusing more than max bytes, and closes the response.
func (r *Response) ReadInto(dst []byte, max int64) ([]byte, error) {
	defer r.Close()
	for {
		if cap(dst)-len(dst) < 512 {
			dst = slices.Grow(dst, 512) // grows the way append does
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if int64(len(dst)) > max {
			return dst, fmt.Errorf("%w: response body over %d bytes", ErrUpstream, max)
		}
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// MaxBody is the limit for ReadAll given at construction.
func (u *Upstream) MaxBody() int64 { return u.maxBody }

// Do sends req and returns once the response headers have arrived. The
// caller must Close the response. A request is sent at most once: a pooled
// connection is checked before anything is written to it, and one found
// closed by the backend is replaced; a write that fails on a pooled
// connection (the backend closed it between the check and the write, so it
// processed nothing) is retried on a fresh one. Nothing is retried once the
// request has been written.
func (u *Upstream) Do(ctx context.Context, req *fasthttp.Request) (*Response, error) {
	// TryAcquire first: Acquire asks ctx for its Done channel, which a
	// context may make on demand, even when a slot is free.
	if !u.slots.TryAcquire(1) {
		if err := u.slots.Acquire(ctx, 1); err != nil {
			return nil, fmt.Errorf("upstream %s: waiting for a connection: %w", u.hc.Addr, context.Cause(ctx))
		}
	}
	for attempt := 0; ; attempt++ {
		r, retry, err := u.try(ctx, req)
		if err == nil {
			return r, nil // the slot is released with the response
		}
		if ctx.Err() != nil {
			u.slots.Release(1)
			return nil, fmt.Errorf("upstream %s: %w", u.hc.Addr, context.Cause(ctx))
		}
		if retry && attempt < 3 {
			continue
		}
		u.slots.Release(1)
		return nil, err
	}
}

// try runs one exchange; retry says the request certainly did not reach
// the backend.
func (u *Upstream) try(ctx context.Context, req *fasthttp.Request) (resp *Response, retry bool, err error) {
	cc, err := u.hc.AcquireConn(0, false)
	if err != nil {
		if errors.Is(err, fasthttp.ErrNoFreeConns) {
			return nil, false, fmt.Errorf("%w: no free connection to %s: %w", ErrUpstream, u.hc.Addr, err)
		}
		return nil, false, fmt.Errorf("%w: %w to %s: %w", ErrUpstream, ErrConnect, u.hc.Addr, err)
	}
	conn := cc.Conn()
	reused := !cc.LastUseTime().IsZero()
	if reused && connClosedByPeer(conn) {
		u.hc.CloseConn(cc)
		return nil, true, fmt.Errorf("%w: pooled connection to %s was closed", ErrUpstream, u.hc.Addr)
	}
	resp = responses.Get().(*Response)
	resp.watch.start(ctx, conn)
	resp.release = func(reuse bool) {
		if !resp.watch.end() {
			reuse = false
		}
		if resp.br != nil {
			u.hc.ReleaseReader(resp.br)
			resp.br = nil
		}
		if reuse {
			u.hc.ReleaseConn(cc)
		} else {
			u.hc.CloseConn(cc)
		}
	}

	bw := u.hc.AcquireWriter(conn)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	u.hc.ReleaseWriter(bw)
	if err != nil {
		resp.release(false)
		resp.recycle()
		return nil, reused, fmt.Errorf("%w: write request to %s: %w", ErrUpstream, u.hc.Addr, err)
	}

	br := u.hc.AcquireReader(conn)
	resp.br = br
	for {
		if err := resp.Header.Read(br); err != nil {
			resp.release(false)
			resp.recycle()
			return nil, false, fmt.Errorf("%w: read response from %s: %w", ErrUpstream, u.hc.Addr, err)
		}
		// An interim answer (103 Early Hints, 100 Continue) precedes the
		// real one on the same connection.
		if c := resp.Header.StatusCode(); c < 100 || c >= 200 || c == fasthttp.StatusSwitchingProtocols {
			break
		}
		resp.Header.Reset()
	}
	resp.body = resp.bodyReader(br)
	resp.slots = u.slots
	return resp, false, nil
}

// bodyReader frames the body the way the headers say.
func (r *Response) bodyReader(br *bufio.Reader) io.Reader {
	h := &r.Header
	if code := h.StatusCode(); code == fasthttp.StatusNoContent || code == fasthttp.StatusNotModified || code < 200 {
		return eofReader{}
	}
	switch cl := h.ContentLength(); {
	case cl >= 0:
		r.sized = sizedBody{r: br, left: int64(cl)}
		return &r.sized
	case cl == -1: // chunked
		r.chunked = chunkedBody{br: br, r: httputil.NewChunkedReader(br)}
		return &r.chunked
	default: // until the backend closes the connection
		h.SetConnectionClose()
		return br
	}
}

// sizedBody reads exactly the Content-Length: a body that ends early is an
// error (and its connection is not reused), not a short success.
type sizedBody struct {
	r    io.Reader
	left int64
}

func (s *sizedBody) Read(p []byte) (int, error) {
	if s.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > s.left {
		p = p[:s.left]
	}
	n, err := s.r.Read(p)
	s.left -= int64(n)
	if errors.Is(err, io.EOF) && s.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// chunkedBody reads a chunked body and, at its end, the trailer section, so
// that the connection is positioned at the next response and can be reused.
type chunkedBody struct {
	br *bufio.Reader
	r  io.Reader
}

func (c *chunkedBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if errors.Is(err, io.EOF) {
		for {
			line, lerr := c.br.ReadSlice('\n')
			if lerr != nil {
				if errors.Is(lerr, io.EOF) {
					lerr = io.ErrUnexpectedEOF // the trailer never ended
				}
				return n, lerr
			}
			if len(bytes.TrimRight(line, "\r\n")) == 0 {
				break
			}
		}
	}
	return n, err
}
