package gateway

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A client still sending a request over the server's limits gets the
// answer (413, 431), not a reset: the gateway reads and drops the rest of
// the request before it closes (lingering close). The bodies are far past
// what the socket buffers of both sides hold, so without it the client's
// writes meet a closed socket.
func TestOversizedRequestGetsItsAnswer(t *testing.T) {
	_, url := startSim(t, nil)
	_, gwURL := startGateway(t, baseConfig(url, "server: {max_body_bytes: 64KiB, max_header_bytes: 8KiB}\n"), Options{})
	body := `{"model":"llama-3-8b","messages":[{"role":"user","content":"` + strings.Repeat("x", 32<<20) + `"}]}`

	check := func(t *testing.T, status int, got []byte, want int, code string) {
		t.Helper()
		if status != want {
			t.Fatalf("status %d, want %d: %.200s", status, want, got)
		}
		if e := decodeError(t, string(got)); e.Error.Code == nil || *e.Error.Code != code {
			t.Fatalf("code %v, want %s", e.Error.Code, code)
		}
	}
	t.Run("body over max_body_bytes, sent whole before reading", func(t *testing.T) {
		for range 2 {
			status, b := rawExchange(t, gwURL, fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))+body)
			check(t, status, b, 413, "request_too_large")
		}
	})
	t.Run("body over max_body_bytes, Go's client", func(t *testing.T) {
		for range 2 {
			r := postJSON(gwURL, "/v1/chat/completions", body)
			if r.err != nil {
				t.Fatal(r.err)
			}
			check(t, r.status, []byte(r.body), 413, "request_too_large")
		}
	})
	t.Run("headers over max_header_bytes, then a body", func(t *testing.T) {
		status, b := rawExchange(t, gwURL, fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\nContent-Length: %d\r\n\r\n", strings.Repeat("h", 16<<10), len(body))+body)
		check(t, status, b, 431, "request_header_too_large")
	})
	if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 3, false)); r.status != 200 {
		t.Fatalf("a good request after the refused ones: %d %s", r.status, r.body)
	}
}

// A client that stops sending after its refused request but keeps the
// connection open holds the gateway's lingering read until
// server.read_timeout at most, and no shutdown waits for it. Wall time:
// read_timeout is a socket deadline, which the kernel keeps.
func TestShutdownEndsALingeringClose(t *testing.T) {
	_, url := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(url, "server: {max_body_bytes: 64KiB, read_timeout: 1h}\n"), Options{})
	c, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":\"llama-3-8b\",", 1<<30)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("status %d, want 413", resp.StatusCode)
	}
	// The gateway now reads what the client might still send; the client
	// sends nothing and stays. The limit is generous: only a shutdown that
	// waited for the read (an hour) misses it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := gw.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with a lingering client: %v", err)
	}
}
