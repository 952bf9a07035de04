package gateway

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

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

func queued(s *Server) int {
	for _, g := range s.rt.Load().groups {
		return g.budget.Stats().Queued
	}
	return -1
}

// A client that hangs up mid-stream cancels the upstream request (the
// backend stops generating) and its reservation is released at once.
func TestDisconnectMidStream(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 }) // 500 tokens take ~8 s: far longer than the test
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
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
	start := time.Now()
	c.Close()
	eventually(t, "the reservation to be released", func() bool { return held(gw) == 0 })
	eventually(t, "the backend to abort the sequence", func() bool { st := backend.Stats(); return st.Running == 0 && st.UsedBlocks == 0 })
	t.Logf("released %s after the hang-up", time.Since(start))
}

// A queued request whose client hangs up leaves the queue at once — fasthttp
// alone would keep it there until admitted (DESIGN.md, "a known hard part").
func TestDisconnectWhileQueued(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	gw, gwURL := startGateway(t, baseConfig(url, "admission:\n  queue: {timeout: 60s}\n"), Options{})
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
		start := time.Now()
		c.Close()
		eventually(t, "the queue to empty", func() bool { return queued(gw) == 0 })
		if d := time.Since(start); d > time.Second {
			t.Errorf("stream=%v: left the queue %s after the hang-up", stream, d)
		}
	}
	for _, c := range fillers {
		c.Close()
	}
	eventually(t, "all reservations to return", func() bool { return held(gw) == 0 })
}

// A non-streaming request whose client hangs up while the backend is still
// generating: the upstream exchange is cancelled (the backend aborts) and the
// reservation returns, without waiting for the answer.
func TestDisconnectWaitingForAnswer(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	c, _ := rawRequest(t, gwURL, "/v1/chat/completions", chatBody("hi", 500, false))
	eventually(t, "the backend to start", func() bool { return backend.Stats().Running == 1 })
	c.Close()
	eventually(t, "the reservation to be released", func() bool { return held(gw) == 0 })
	eventually(t, "the backend to abort", func() bool { return backend.Stats().Running == 0 })
}
