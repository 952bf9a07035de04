package gateway

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
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
			var logs syncBuffer
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
			for _, k := range []string{"id", "tenant", "route", "model", "gpu", "backend", "status", "outcome", "reason",
				"queue_wait_ms", "ttft_ms", "duration_ms", "prompt_tokens", "output_tokens", "kv_reserved_bytes"} {
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
