package backends

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// serve runs a fasthttp server with h on a loopback port.
func serve(t *testing.T, h fasthttp.RequestHandler) (addr string, srv *fasthttp.Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv = &fasthttp.Server{Handler: h, CloseOnShutdown: true}
	return serveOn(t, ln, srv), srv
}

// serveOn serves srv, configured before it starts, on ln.
func serveOn(t *testing.T, ln net.Listener, srv *fasthttp.Server) (addr string) {
	t.Helper()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	return ln.Addr().String()
}

func post(addr, path, body string) *fasthttp.Request {
	req := &fasthttp.Request{}
	req.Header.SetMethod("POST")
	req.SetRequestURI("http://" + addr + path)
	req.Header.SetContentType("application/json")
	req.SetBodyString(body)
	return req
}

func TestUpstreamContentLengthAndReuse(t *testing.T) {
	var conns atomic.Int32
	addr, _ := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		fmt.Fprintf(ctx, `{"echo":%q,"conn":%d}`, ctx.PostBody(), ctx.ConnID())
	})
	u := NewUpstream(addr, UpstreamOptions{DialForTesting: func(a string) (net.Conn, error) {
		conns.Add(1)
		return net.Dial("tcp", a)
	}})
	for i := range 5 {
		r, err := u.Do(context.Background(), post(addr, "/x", fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		b, err := r.ReadAll(1 << 20)
		if err != nil || !strings.Contains(string(b), fmt.Sprintf(`"echo":"%d"`, i)) || r.Status() != 200 {
			t.Fatalf("round %d: %q %v", i, b, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("dialed %d connections for 5 sequential requests, want 1 (keep-alive)", n)
	}
}

// SSE arrives chunk by chunk: the first event must be readable before the
// server has written the second.
func TestUpstreamStreamsChunked(t *testing.T) {
	release := make(chan struct{})
	addr, _ := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			fmt.Fprint(w, "data: one\n\n")
			w.Flush()
			<-release
			fmt.Fprint(w, "data: two\n\n")
			w.Flush()
		})
	})
	u := NewUpstream(addr, UpstreamOptions{})
	r, err := u.Do(context.Background(), post(addr, "/s", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	if !r.IsEventStream() {
		t.Fatalf("content type %q", r.Header.ContentType())
	}
	br := bufio.NewReader(r)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: two\n\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
	r.Close()
	// The connection was read to its end, trailer included, so it is reused
	// cleanly by the next request.
	r2, err := u.Do(context.Background(), post(addr, "/s2", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := r2.ReadAll(1 << 20); err != nil || !strings.Contains(string(b), "two") {
		t.Fatalf("second exchange: %q %v", b, err)
	}
}

// Cancelling while the backend has not answered closes the connection: the
// backend sees its client go, which is what makes vLLM abort the request.
func TestUpstreamCancelBeforeHeaders(t *testing.T) {
	arrived, gone := make(chan struct{}), make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// Read the request, never answer, and report when the peer closes.
		buf := make([]byte, 4096)
		for first := true; ; first = false {
			if _, err := c.Read(buf); err != nil {
				close(gone)
				return
			}
			if first {
				close(arrived)
			}
		}
	}()
	u := NewUpstream(ln.Addr().String(), UpstreamOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := u.Do(ctx, post(ln.Addr().String(), "/slow", "{}"))
		errc <- err
	}()
	<-arrived // the request reached the server, which will never answer
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Do after cancel: %v, want context.Canceled", err)
	}
	<-gone // fails by hanging if the connection stays open
}

func TestUpstreamCancelMidStream(t *testing.T) {
	aborted := make(chan struct{})
	addr, _ := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for {
				fmt.Fprint(w, "data: tick\n\n")
				if err := w.Flush(); err != nil {
					close(aborted)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	})
	u := NewUpstream(addr, UpstreamOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	r, err := u.Do(ctx, post(addr, "/s", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := r.Read(buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	for {
		if _, err := r.Read(buf); err != nil {
			break
		}
	}
	r.Close()
	<-aborted
}

// A keep-alive connection the backend closed while idle is retried on a new
// one instead of failing the request.
func TestUpstreamRetriesStaleConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{}, 4)
	addr := serveOn(t, ln, &fasthttp.Server{
		Handler:         func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") },
		CloseOnShutdown: true,
		// Each connection is closed as soon as it is idle: the one the
		// upstream pools after a round is stale by the next.
		IdleTimeout: time.Millisecond,
		ConnState: func(_ net.Conn, st fasthttp.ConnState) {
			if st == fasthttp.StateClosed {
				closed <- struct{}{}
			}
		},
	})
	u := NewUpstream(addr, UpstreamOptions{})
	for i := range 3 {
		r, err := u.Do(context.Background(), post(addr, "/", "{}"))
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if b, err := r.ReadAll(100); err != nil || string(b) != "ok" {
			t.Fatalf("round %d: %q %v", i, b, err)
		}
		<-closed // the server closed the connection the upstream keeps
	}
}

func TestUpstreamRefused(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	u := NewUpstream(addr, UpstreamOptions{})
	_, err := u.Do(context.Background(), post(addr, "/", "{}"))
	if !errors.Is(err, ErrUpstream) || !errors.Is(err, ErrConnect) {
		t.Fatalf("err = %v, want ErrUpstream and ErrConnect", err)
	}
}

func TestReadAllLimit(t *testing.T) {
	addr, _ := serve(t, func(ctx *fasthttp.RequestCtx) { ctx.WriteString(strings.Repeat("x", 1000)) })
	u := NewUpstream(addr, UpstreamOptions{})
	r, err := u.Do(context.Background(), post(addr, "/", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadAll(999); !errors.Is(err, ErrUpstream) {
		t.Fatalf("over-limit body: %v", err)
	}
}

// rawServer hands each accepted connection to handle, for answers fasthttp's
// server would never give.
func rawServer(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); handle(c) }()
		}
	}()
	return ln.Addr().String()
}

// A body cut short of its Content-Length is an error, not a short success,
// and the connection is not pooled (review finding: truncated JSON got 200).
func TestUpstreamShortContentLength(t *testing.T) {
	addr := rawServer(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"choices\":[{\"te"))
	})
	u := NewUpstream(addr, UpstreamOptions{})
	r, err := u.Do(context.Background(), post(addr, "/x", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := r.ReadAll(1 << 20); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated body: %q, %v", b, err)
	}
	if n := u.hc.IdleConnsCount(); n != 0 {
		t.Errorf("%d broken connections pooled", n)
	}
}

// An interim 1xx answer is skipped; the real one follows on the same
// connection (review finding: the next request got the previous answer).
func TestUpstreamSkipsInterimResponses(t *testing.T) {
	addr := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for i := 0; ; i++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			if i == 0 {
				c.Write([]byte("HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"))
			}
			body := "answer to " + req.URL.Path
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	})
	u := NewUpstream(addr, UpstreamOptions{})
	for _, p := range []string{"/first", "/second"} {
		r, err := u.Do(context.Background(), post(addr, p, "{}"))
		if err != nil {
			t.Fatal(err)
		}
		if b, err := r.ReadAll(1 << 20); err != nil || r.Status() != 200 || string(b) != "answer to "+p {
			t.Fatalf("%s: %d %q %v", p, r.Status(), b, err)
		}
	}
}

// A backend that received the request and dropped the connection without
// answering is not sent it again (review finding: a POST arrived twice).
func TestUpstreamNeverResendsAWrittenRequest(t *testing.T) {
	var got atomic.Int32
	addr := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for i := 0; ; i++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			if req.URL.Path == "/gen" {
				got.Add(1)
				return // took the request, then died
			}
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
		}
	})
	u := NewUpstream(addr, UpstreamOptions{})
	r, err := u.Do(context.Background(), post(addr, "/warm", "{}")) // pools a connection
	if err != nil {
		t.Fatal(err)
	}
	r.ReadAll(100)
	if _, err := u.Do(context.Background(), post(addr, "/gen", "{}")); !errors.Is(err, ErrUpstream) {
		t.Fatalf("err = %v", err)
	}
	if n := got.Load(); n != 1 {
		t.Fatalf("the backend received the request %d times", n)
	}
}

// Waiting for a connection slot honours the context: with every connection
// busy, a request whose context ends gives up at once (review finding: it
// waited, holding its reservation, past hang-up and timeout).
func TestUpstreamSlotWaitHonoursContext(t *testing.T) {
	release, busy := make(chan struct{}), make(chan struct{})
	var once sync.Once
	addr := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			once.Do(func() { close(busy) })
			<-release
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
		}
	})
	defer close(release)
	u := NewUpstream(addr, UpstreamOptions{MaxConns: 1})
	go func() {
		if r, err := u.Do(context.Background(), post(addr, "/slow", "{}")); err == nil {
			r.ReadAll(100)
		}
	}()
	<-busy // the first holds the only connection until the test ends
	// Were the wait deaf to the context, the second would hang there too.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := u.Do(ctx, post(addr, "/second", "{}")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
}

// A released Response goes back to a pool while the AfterFunc watching a
// plain context may still be running (the context ended while the answer
// was being read, and the AfterFunc closes the connection): nothing it
// touches may be the Response's, which the next exchange is using by then.
// Meaningful under -race.
func TestReleaseWhileTheContextEnds(t *testing.T) {
	addr, _ := serve(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") })
	u := NewUpstream(addr, UpstreamOptions{})
	for range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		r, err := u.Do(ctx, post(addr, "/x", "{}"))
		if err != nil {
			t.Fatal(err)
		}
		cancel() // its AfterFunc starts, and runs beside what follows
		r.ReadAll(1 << 10)
		r.Release()
	}
}
