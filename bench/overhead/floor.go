package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/valyala/fasthttp"
)

// The floor is a reverse proxy made of fasthttp and nothing else, doing what
// nginx does in this bench: it forwards each request (method, path, headers,
// body) over kept-alive connections and relays the answer as it arrives. A
// proxy built on fasthttp cannot be faster than this, so kvgate measured
// beside it shows what its own work costs apart from what the library
// costs. It is run as `overhead floor --listen host:port --backend host:port`.

// runFloor serves the floor until the process is stopped.
func runFloor(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("overhead floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "", "`host:port` to serve on (required)")
	backend := fs.String("backend", "", "`host:port` of the backend to forward to (required)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case *listen == "":
		fmt.Fprintln(stderr, "overhead floor: --listen is required")
		return 2
	case *backend == "":
		fmt.Fprintln(stderr, "overhead floor: --backend is required")
		return 2
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "overhead floor: --listen: %v\n", err)
		return 1
	}
	if err := newFloor(*backend).Serve(ln); err != nil {
		fmt.Fprintf(stderr, "overhead floor: %v\n", err)
		return 1
	}
	return 0
}

// floor forwards to one backend.
type floor struct {
	hc     *fasthttp.HostClient
	bodies sync.Pool // *upstreamBody
}

// newFloor is the floor's server in front of backend ("host:port").
func newFloor(backend string) *fasthttp.Server {
	f := &floor{hc: &fasthttp.HostClient{
		Addr: backend,
		// As kvgate's upstream pool (backends.NewUpstream).
		MaxConns:        1024,
		ReadBufferSize:  16 << 10,
		WriteBufferSize: 16 << 10,
		// Bodies are relayed as they arrive, not read whole first, as
		// nginx does with proxy_buffering off.
		StreamResponseBody: true,
		// Forward the request as the client sent it.
		DisablePathNormalizing:   true,
		NoDefaultUserAgentHeader: true,
	}}
	f.bodies.New = func() any { return &upstreamBody{pool: &f.bodies} }
	return &fasthttp.Server{
		Handler:               f.serve,
		MaxRequestBodySize:    8 << 20, // nginx's client_max_body_size in run.sh
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
	}
}

func (f *floor) serve(ctx *fasthttp.RequestCtx) {
	b := f.bodies.Get().(*upstreamBody)
	// The server has already noted a client's "Connection: close"; the
	// connection to the backend stays open whatever the client's does.
	ctx.Request.Header.ResetConnectionClose()
	if err := f.hc.Do(&ctx.Request, &b.resp); err != nil {
		b.Close()
		ctx.Error("bad gateway: "+err.Error(), fasthttp.StatusBadGateway)
		return
	}
	b.resp.Header.CopyTo(&ctx.Response.Header)
	ctx.Response.Header.ResetConnectionClose()
	if b.resp.BodyStream() == nil { // a body the status or method rules out
		b.Close()
		return
	}
	// fasthttp writes a sized stream with its Content-Length and any other
	// chunked, one chunk per Read, each flushed to the client; then it
	// calls Close, which gives the connection back to the pool (or closes
	// it, if the body was not read to its end).
	n := b.resp.Header.ContentLength()
	if n < 0 {
		n = -1
	}
	ctx.SetBodyStream(b, n)
}

// upstreamBody is a backend's answer as the body of the client's.
type upstreamBody struct {
	resp fasthttp.Response
	pool *sync.Pool
}

func (b *upstreamBody) Read(p []byte) (int, error) { return b.resp.BodyStream().Read(p) }

func (b *upstreamBody) Close() error {
	err := b.resp.CloseBodyStream()
	b.resp.Reset()
	b.pool.Put(b)
	return err
}
