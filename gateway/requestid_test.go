package gateway

import (
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// Every answer and refusal, on every route family, carries X-Request-Id:
// the client's when it sent a sane one, else a fresh UUID — never a
// counter, never the raw bytes of an id the gateway would not log.
func TestRequestIDOnEveryAnswer(t *testing.T) {
	_, simURL := startSim(t, nil)
	_, gwURL := startGateway(t, baseConfig(simURL, "admin: {api_keys: [adm]}\nserver: {max_header_bytes: 4KiB}\n"), Options{})
	routes := []struct {
		name, method, path, body string
		header                   []string
		status                   int
	}{
		{"chat", "POST", "/v1/chat/completions", chatBody("hi", 3, false), nil, 200},
		{"chat streamed", "POST", "/v1/chat/completions", chatBody("hi", 3, true), nil, 200},
		{"completions", "POST", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":3}`, nil, 200},
		{"messages", "POST", "/v1/messages", `{"model":"llama-3-8b","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, nil, 200},
		{"tokenize", "POST", "/tokenize", `{"model":"llama-3-8b","prompt":"hi"}`, nil, 200},
		{"models", "GET", "/v1/models", "", nil, 200},
		{"readyz", "GET", "/readyz", "", nil, 200},
		{"status refused", "GET", "/status", "", nil, 401},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, nil, 404},
		{"too long for the model", "POST", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":9000}`, nil, 400},
		{"wrong method", "GET", "/v1/chat/completions", "", nil, 405},
		{"unknown url", "GET", "/nope", "", nil, 404},
		{"headers too large", "GET", "/v1/models", "", []string{"X-Big", strings.Repeat("b", 8<<10)}, 431},
	}
	for _, r := range routes {
		for _, id := range []struct{ sent, want string }{
			{"", "uuid"},
			{"client-7f3a", "client-7f3a"},
			{"has space", "uuid"},
			{strings.Repeat("x", maxRequestID+1), "uuid"},
		} {
			t.Run(r.name+"/"+id.sent[:min(len(id.sent), 12)], func(t *testing.T) {
				req, err := http.NewRequest(r.method, gwURL+r.path, strings.NewReader(r.body))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				if id.sent != "" {
					req.Header.Set("X-Request-Id", id.sent)
				}
				for i := 0; i+1 < len(r.header); i += 2 {
					req.Header.Set(r.header[i], r.header[i+1])
				}
				resp, err := httpClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != r.status {
					t.Fatalf("status %d, want %d", resp.StatusCode, r.status)
				}
				got := resp.Header.Values("X-Request-Id")
				if len(got) != 1 {
					t.Fatalf("X-Request-Id %q, want one", got)
				}
				if r.status == 431 {
					id.want = "uuid" // the headers were not read: the id is the gateway's
				}
				if id.want == "uuid" && !uuidV4.MatchString(got[0]) || id.want != "uuid" && got[0] != id.want {
					t.Errorf("X-Request-Id %q, want %s", got[0], id.want)
				}
			})
		}
	}
}

// The id a client gets is the access line's and the span's.
func TestRequestIDInAccessLineAndSpan(t *testing.T) {
	_, simURL := startSim(t, nil)
	rcv := startReceiver(t)
	var logs syncBuffer
	gw, gwURL := startGateway(t, baseConfig(simURL, tracingYAML(rcv.url, "")), Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	seen := map[string]bool{}
	for _, sent := range []string{"", "client-42"} {
		var hdr []string
		if sent != "" {
			hdr = []string{"X-Request-Id", sent}
		}
		r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 3, false), hdr...)
		id := r.header.Get("X-Request-Id")
		if r.status != 200 || id == "" || sent != "" && id != sent {
			t.Fatalf("%d %q %s", r.status, id, r.body)
		}
		seen[id] = true
	}
	lines := accessLines(t, logs.String())
	if len(lines) != 2 {
		t.Fatalf("%d access lines", len(lines))
	}
	for _, l := range lines {
		if !seen[l["id"].(string)] {
			t.Errorf("access line id %v is not one the client got (%v)", l["id"], seen)
		}
	}
	traceOf := map[string]string{} // access line's id → trace_id
	for _, l := range lines {
		traceOf[l["id"].(string)] = l["trace_id"].(string)
	}
	spans := 0
	for _, sp := range rcv.flushUntil(t, gw, 2) {
		if sp.Name != spanNames[chatCompletions] {
			continue
		}
		spans++
		v := attrOf(sp.Attributes, "http.request.header.x-request-id").GetArrayValue().GetValues()
		if len(v) != 1 || !seen[v[0].GetStringValue()] {
			t.Errorf("span's x-request-id %v, want one of %v", v, seen)
			continue
		}
		if got, want := traceOf[v[0].GetStringValue()], hex.EncodeToString(sp.TraceId); got != want {
			t.Errorf("access line's trace_id %q, the span's %q", got, want)
		}
	}
	if spans != 2 {
		t.Errorf("%d request spans", spans)
	}
}

func BenchmarkRequestID(b *testing.B) {
	buf := make([]byte, 0, 36)
	for b.Loop() {
		buf = appendUUID(buf[:0])
	}
}
