package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/syncbuf"
)

// accessLines are the access lines of a JSON log.
func accessLines(t testing.TB, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not JSON: %q", l)
		}
		if m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

// One access line per proxied request, whichever way it leaves, with what
// the gateway decided and measured; log.access: false turns it off.
func TestAccessLog(t *testing.T) {
	_, simURL := startSim(t, nil)
	extra := "tenants: [{name: acme, api_keys: [key-acme]}]\n"
	auth := []string{"Authorization", "Bearer key-acme"}
	cases := []struct {
		name, log, path, body string
		header                []string
		want                  map[string]any // fields and their values
		positive              []string       // fields that must be > 0
	}{
		{"answered", "", "/v1/chat/completions", chatBody("hello there", 5, false), append([]string{"X-Request-Id", "req-42"}, auth...),
			map[string]any{"id": "req-42", "tenant": "acme", "route": "/v1/chat/completions", "model": "llama-3-8b", "gpu": "gpu0", "backend": "gpu0",
				"status": 200.0, "outcome": "ok", "reason": "", "queue_wait_ms": 0.0, "ttft_ms": 0.0, "output_tokens": 5.0},
			[]string{"duration_ms", "prompt_tokens", "kv_reserved_bytes"}},
		{"streamed", "", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":4,"stream":true}`, auth,
			map[string]any{"route": "/v1/completions", "status": 200.0, "outcome": "ok", "output_tokens": 4.0, "gpu": "gpu0"},
			[]string{"ttft_ms", "duration_ms", "prompt_tokens", "kv_reserved_bytes"}},
		{"unknown model", "", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, auth,
			map[string]any{"tenant": "acme", "model": "unknown", "status": 404.0, "outcome": "rejected", "reason": "unknown_model", "gpu": "", "kv_reserved_bytes": 0.0}, nil},
		{"bad key", "", "/v1/chat/completions", chatBody("hi", 5, false), []string{"Authorization", "Bearer wrong"},
			map[string]any{"tenant": "", "status": 401.0, "outcome": "rejected", "reason": "unauthorized"}, nil},
		{"too large", "", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":9000}`, auth,
			map[string]any{"status": 400.0, "outcome": "rejected", "reason": "invalid_request"}, nil},
		{"off", "log: {access: false}\n", "/v1/chat/completions", chatBody("hi", 5, false), auth, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var logs syncbuf.Buffer
			logger := slog.New(slog.NewJSONHandler(&logs, nil))
			_, gwURL := startGateway(t, baseConfig(simURL, extra+c.log), Options{Logger: logger})
			r := postJSON(gwURL, c.path, c.body, c.header...)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if c.want == nil {
				if lines := accessLines(t, logs.String()); len(lines) != 0 {
					t.Fatalf("log.access: false wrote %v", lines)
				}
				return
			}
			// A stream's line is written as its relay finishes, just after
			// the client has its last byte.
			eventually(t, "the access line", func() bool { return len(accessLines(t, logs.String())) > 0 })
			lines := accessLines(t, logs.String())
			if len(lines) != 1 {
				t.Fatalf("%d access lines: %v", len(lines), lines)
			}
			got := lines[0]
			if got["level"] != "INFO" {
				t.Errorf("level %v", got["level"])
			}
			for k, v := range c.want {
				if got[k] != v {
					t.Errorf("%s = %#v, want %#v (line %v)", k, got[k], v, got)
				}
			}
			for _, k := range c.positive {
				if f, _ := got[k].(float64); f <= 0 {
					t.Errorf("%s = %v, want > 0 (line %v)", k, got[k], got)
				}
			}
			for _, k := range []string{"id", "method", "route", "client", "x_forwarded_for", "user_agent", "tenant", "model", "gpu", "backend",
				"upstream_addr", "retries", "status", "outcome", "reason", "queue_wait_ms", "ttft_ms", "upstream_ms", "duration_ms",
				"bytes_in", "bytes_out", "prompt_tokens", "output_tokens", "kv_reserved_bytes", "trace_id"} {
				if _, ok := got[k]; !ok {
					t.Errorf("no %s in %v", k, got)
				}
			}
			if s := logs.String(); strings.Contains(s, "key-acme") || strings.Contains(s, "hello there") {
				t.Errorf("a key or a prompt was logged:\n%s", s)
			}
		})
	}
}

// The access line's HTTP fields, as nginx and Envoy log them, one family a
// case: who asked (method, client, X-Forwarded-For, user agent), how much
// went each way, where it went (upstream address and time, retries), and
// the trace it belongs to.
func TestAccessLogHTTPFields(t *testing.T) {
	_, simURL := startSim(t, nil)
	simAddr := strings.TrimPrefix(simURL, "http://")
	// A backend that refuses connections, on a GPU of its own: a request
	// bound there moves to the simulator's GPU, once.
	dead := "http://127.0.0.1:1"
	var logs syncbuf.Buffer
	_, gwURL := startGateway(t, fleetConfig("", dead, simURL), Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), DisableProbes: true})
	lineOf := func(id string) map[string]any {
		t.Helper()
		var line map[string]any
		eventually(t, "the access line of "+id, func() bool {
			for _, l := range accessLines(t, logs.String()) {
				if l["id"] == id {
					line = l
					return true
				}
			}
			return false
		})
		return line
	}
	send := func(id, body string, header ...string) (string, result) {
		r := postJSON(gwURL, "/v1/chat/completions", body, append([]string{"X-Request-Id", id}, header...)...)
		if r.status != 200 {
			t.Fatalf("%s: %d %s", id, r.status, r.body)
		}
		return id, r
	}

	t.Run("client", func(t *testing.T) {
		l := lineOf(must(send("who", chatBody("hi", 3, false), "X-Forwarded-For", "203.0.113.7, 10.0.0.1", "User-Agent", "OpenAI/Python 1.99.0")))
		if l["method"] != "POST" || l["x_forwarded_for"] != "203.0.113.7, 10.0.0.1" || l["user_agent"] != "OpenAI/Python 1.99.0" ||
			!strings.HasPrefix(l["client"].(string), "127.0.0.1:") {
			t.Errorf("line %v", l)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		for _, stream := range []bool{false, true} {
			body := chatBody("hello there", 4, stream)
			id, r := send(fmt.Sprint("bytes-", stream), body)
			l := lineOf(id)
			if l["bytes_in"] != float64(len(body)) || l["bytes_out"] != float64(len(r.body)) {
				t.Errorf("stream %v: bytes_in %v bytes_out %v, want %d and %d", stream, l["bytes_in"], l["bytes_out"], len(body), len(r.body))
			}
		}
	})
	t.Run("upstream", func(t *testing.T) {
		retried := false
		for i := range 8 {
			l := lineOf(must(send(fmt.Sprint("up-", i), chatBody("hi", 3, false))))
			if l["upstream_addr"] != simAddr || l["backend"] != "gpu1" {
				t.Fatalf("line %v, want upstream_addr %s", l, simAddr)
			}
			if up, d := l["upstream_ms"].(float64), l["duration_ms"].(float64); up <= 0 || up > d {
				t.Errorf("upstream_ms %v of duration_ms %v", up, d)
			}
		}
		// The first request bound to the dead GPU opened its circuit,
		// whichever subtest sent it.
		for _, l := range accessLines(t, logs.String()) {
			switch l["retries"] {
			case 1.0:
				retried = true
			case 0.0:
			default:
				t.Errorf("retries %v", l["retries"])
			}
		}
		if !retried {
			t.Error("no request was retried from the dead backend")
		}
	})
	t.Run("trace", func(t *testing.T) {
		const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		if l := lineOf(must(send("traced", chatBody("hi", 3, false), "Traceparent", tp))); l["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("trace_id %v", l["trace_id"])
		}
		if l := lineOf(must(send("untraced", chatBody("hi", 3, false)))); l["trace_id"] != "" {
			t.Errorf("trace_id %v with tracing off and no traceparent", l["trace_id"])
		}
	})
	// The fasthttp logger's lines have one msg, as every line does.
	resp, err := http.Post(gwURL+"/v1/chat/completions", "application/json", io.LimitReader(strings.NewReader("{"), 1))
	if err == nil {
		resp.Body.Close()
	}
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Count(l, `"msg":`) != 1 {
			t.Errorf("a line with %d msg: %s", strings.Count(l, `"msg":`), l)
		}
	}
}

func must[T any](v T, _ result) T { return v }
