package gateway

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/backends/sim"
)

// rawRequest opens a connection to the gateway and sends one request on it,
// so the test can hang up whenever it likes.
func rawRequest(t *testing.T, gwURL, path, body string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body)
	return c, bufio.NewReader(c)
}

func queued(s *Server) int { return s.rt.Load().sched.Stats().Queued }

// A client that hangs up mid-stream cancels the upstream request (the
// backend stops generating) and its reservation is released
// admission.abort_hold (1s) later, on the gateway's clock, which the test
// moves.
func TestDisconnectMidStream(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 }) // 500 tokens take ~8 s: far longer than the test
	clock := newClock()
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{Clock: clock})
	c, br := rawRequest(t, gwURL, "/v1/chat/completions", chatBody("hi", 500, true))
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":" `) {
			break // a real token has arrived: the stream is under way
		}
	}
	if held(gw) == 0 || backend.Stats().Running != 1 {
		t.Fatalf("before hang-up: held %d, backend running %d", held(gw), backend.Stats().Running)
	}
	// Wall time for the log: the hang-up reaches the gateway from the kernel.
	start := time.Now()
	c.Close()
	advanceUntil(t, clock, 100*time.Millisecond, "the reservation to be released", func() bool { return held(gw) == 0 })
	eventually(t, "the backend to abort the sequence", func() bool { st := backend.Stats(); return st.Running == 0 && st.UsedBlocks == 0 })
	t.Logf("released %s after the hang-up", time.Since(start))
}

// A queued request whose client hangs up leaves the queue at once — fasthttp
// alone would keep it there until admitted (DESIGN.md, "a known hard part").
// The gateway's clock, which the test moves, takes the client's watch on
// (a tick after the request queues) and releases the fillers' reservations
// (admission.abort_hold); the hang-up's own way from the kernel is timed on
// the wall clock.
func TestDisconnectWhileQueued(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	clock := newClock()
	gw, gwURL := startGateway(t, baseConfig(url, "admission:\n  queue: {timeout: 60s}\n"), Options{Clock: clock})
	// Fill the budget: two 7990-token requests hold 1000 of 1045 blocks.
	var fillers []net.Conn
	for range 2 {
		c, _ := rawRequest(t, gwURL, "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":7990}`)
		fillers = append(fillers, c)
	}
	eventually(t, "the budget to fill", func() bool { return held(gw) >= 1000*(2<<20) })
	for _, stream := range []bool{false, true} {
		c, _ := rawRequest(t, gwURL, "/v1/chat/completions", chatBody("hi", 1600, stream))
		eventually(t, "the request to queue", func() bool { return queued(gw) == 1 })
		clock.Advance(queueWatchTicks * sweepTick) // its client is watched from now on
		start := time.Now()
		c.Close()
		// Steps far short of the queue's timeout (60s): only the hang-up empties it.
		advanceUntil(t, clock, sweepTick, "the queue to empty", func() bool { return queued(gw) == 0 })
		if d := time.Since(start); d > time.Second {
			t.Errorf("stream=%v: left the queue %s after the hang-up", stream, d)
		}
	}
	for _, c := range fillers {
		c.Close()
	}
	advanceUntil(t, clock, 100*time.Millisecond, "all reservations to return", func() bool { return held(gw) == 0 })
}

// A non-streaming request whose client hangs up while the backend is still
// generating: the upstream exchange is cancelled (the backend aborts) and the
// reservation returns, without waiting for the answer. The gateway's clock,
// which the test moves, takes the client's watch on and ends
// admission.abort_hold.
func TestDisconnectWaitingForAnswer(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	clock := newClock()
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{Clock: clock})
	c, _ := rawRequest(t, gwURL, "/v1/chat/completions", chatBody("hi", 500, false))
	eventually(t, "the backend to start", func() bool { return backend.Stats().Running == 1 })
	c.Close()
	advanceUntil(t, clock, 100*time.Millisecond, "the reservation to be released", func() bool { return held(gw) == 0 })
	eventually(t, "the backend to abort", func() bool { return backend.Stats().Running == 0 })
}

// Review finding: a client that stops reading blocks the relay in its
// writes, and the reservation stayed held until the write deadline, long
// after the request timed out and the backend freed the blocks. It now goes
// back the moment the request's context ends.
func TestStalledReaderReleasesAtTimeout(t *testing.T) {
	// A backend that streams 1 KiB events as fast as it can, forever.
	chunk := []byte(`data: {"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 1024) + `"},"finish_reason":null}]}` + "\n\n")
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/tokenize":
			ctx.WriteString(`{"count":3,"max_model_len":8192,"tokens":[1,2,3]}`)
		case "/health", "/metrics":
		default:
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				for {
					if _, err := w.Write(chunk); err != nil || w.Flush() != nil {
						return
					}
				}
			})
		}
	}}
	url := serveLoopback(t, srv.Serve, srv.ShutdownWithContext)
	clock := newClock()
	gw, gwURL := startGateway(t, baseConfig(url, "server: {request_timeout: 30s}\n"), Options{Clock: clock})
	c, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4096) // and never read
	body := chatBody("hi", 1000, true)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	eventually(t, "the request to be admitted", func() bool { return held(gw) > 0 })
	start := clock.Now()
	clock.Advance(30 * time.Second)
	// The exchange is cut at the timeout; the reservation follows
	// admission.abort_hold (1s) later, however long the write blocks.
	advanceUntil(t, clock, 100*time.Millisecond, "the reservation to return after the timeout", func() bool { return held(gw) == 0 })
	if d := clock.Now().Sub(start); d > 35*time.Second {
		t.Errorf("released %s after admission on the gateway's clock (request_timeout 30s, abort_hold 1s)", d)
	}
}
