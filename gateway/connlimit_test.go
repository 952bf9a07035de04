package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Issue 26, R7: past server.max_connections fasthttp answered a plain-text
// 503 without Retry-After, to probes too, so an orchestrator would restart
// a gateway that was only busy. A request past the limit gets an OpenAI
// error with Retry-After; /healthz and /readyz still answer.
func TestPastMaxConnections(t *testing.T) {
	_, url := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(url, "server: {max_connections: 2}\n"), Options{})
	eventually(t, "the backend to be ready", func() bool { return gw.rt.Load().upstreams.Ready() })
	addr := strings.TrimPrefix(gwURL, "http://")
	// Two keep-alive connections take the whole limit.
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: kvgate\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("a connection under the limit: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	body := chatBody("hi", 2, false)
	for _, tc := range []struct {
		name, req  string
		status     int
		retryAfter bool
	}{
		{"completion", "POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body, 503, true},
		{"models", "GET /v1/models HTTP/1.1\r\nHost: kvgate\r\n\r\n", 503, true},
		{"liveness", "GET /healthz HTTP/1.1\r\nHost: kvgate\r\n\r\n", 200, false},
		{"readiness", "GET /readyz HTTP/1.1\r\nHost: kvgate\r\n\r\n", 200, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if !tc.retryAfter {
				return
			}
			if e := decodeError(t, string(b)); e.Error.Code == nil || *e.Error.Code != "too_many_connections" {
				t.Errorf("error %s", b)
			}
			if resp.Header.Get("Retry-After") == "" || !resp.Close {
				t.Errorf("Retry-After %q, Connection: close %v", resp.Header.Get("Retry-After"), resp.Close)
			}
		})
	}
}
