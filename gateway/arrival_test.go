package gateway

import (
	"bufio"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/syncbuf"
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
	var logs syncbuf.Buffer
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

// A browser's preflight from an allowed origin is answered with the grants
// it asked for; from another origin, or for a method or header not allowed,
// it is refused; an allowed origin's real request gets the headers that let
// its page read the answer. Without server.cors a preflight is refused
// saying what to set.
func TestCORS(t *testing.T) {
	_, url := startSim(t, nil)
	_, gw := startGateway(t, baseConfig(url, `server:
  cors:
    allowed_origins: ["https://app.example.com", "http://localhost:5173/"]
`), Options{})
	_, plain := startGateway(t, baseConfig(url, ""), Options{})
	preflight := func(base, origin, method, headers string) *http.Response {
		req, _ := http.NewRequest(http.MethodOptions, base+"/v1/chat/completions", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", method)
		if headers != "" {
			req.Header.Set("Access-Control-Request-Headers", headers)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, tc := range []struct {
		name, base, origin, method, headers string
		status                              int
		granted                             bool
	}{
		{"allowed origin", gw, "https://app.example.com", "POST", "authorization, content-type, x-stainless-os", 204, true},
		{"allowed origin with a trailing slash in the config", gw, "http://localhost:5173", "POST", "", 204, true},
		{"another origin", gw, "https://evil.example.com", "POST", "authorization", 403, false},
		{"a method not allowed", gw, "https://app.example.com", "DELETE", "", 403, false},
		{"a header not allowed", gw, "https://app.example.com", "POST", "x-secret", 403, false},
		{"no cors configured", plain, "https://app.example.com", "POST", "", 403, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := preflight(tc.base, tc.origin, tc.method, tc.headers)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			got := resp.Header.Get("Access-Control-Allow-Origin")
			if tc.granted != (got == tc.origin) || (!tc.granted && got != "") {
				t.Fatalf("Access-Control-Allow-Origin %q (granted %v)", got, tc.granted)
			}
			if tc.granted && (!strings.Contains(resp.Header.Get("Access-Control-Allow-Methods"), "POST") ||
				resp.Header.Get("Access-Control-Allow-Headers") != tc.headers) {
				t.Fatalf("grants: methods %q, headers %q", resp.Header.Get("Access-Control-Allow-Methods"), resp.Header.Get("Access-Control-Allow-Headers"))
			}
		})
	}
	for _, tc := range []struct {
		origin string
		read   bool
	}{{"https://app.example.com", true}, {"https://evil.example.com", false}} {
		r := postJSON(gw, "/v1/chat/completions", chatBody("hi", 5, false), "Origin", tc.origin)
		if r.status != 200 {
			t.Fatalf("%s: status %d %s", tc.origin, r.status, r.body)
		}
		if got := r.header.Get("Access-Control-Allow-Origin") == tc.origin; got != tc.read ||
			tc.read != strings.Contains(r.header.Get("Access-Control-Expose-Headers"), "Retry-After") {
			t.Errorf("%s: answer's CORS headers %v", tc.origin, r.header)
		}
	}
}

func TestCORSConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"server: {cors: {}}\n", "server.cors.allowed_origins: list at least one origin"},
		{"server: {cors: {allowed_origins: [app.example.com]}}\n", "server.cors.allowed_origins[0]: \"app.example.com\" is not an origin"},
		{"server: {cors: {allowed_origins: [\"https://a.example/path\"]}}\n", "server.cors.allowed_origins[0]"},
		{"server: {cors: {allowed_origins: [\"*\"], allowed_methods: [\"GET POST\"]}}\n", "server.cors.allowed_methods[0]"},
	} {
		_, err := Parse([]byte(baseConfig("http://127.0.0.1:1", tc.yaml)), ".")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// With CORS off, a preflight's refusal says it is CORS and what to set,
// rather than a 405 for OPTIONS.
func TestPreflightWithCORSOffSaysWhatToSet(t *testing.T) {
	_, url := startSim(t, nil)
	_, gw := startGateway(t, baseConfig(url, ""), Options{})
	req, _ := http.NewRequest(http.MethodOptions, gw+"/v1/chat/completions", nil)
	req.Header.Set("Origin", "http://localhost:5173")
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	e := decodeError(t, string(b))
	if resp.StatusCode != 403 || e.Error.Code == nil || *e.Error.Code != "cors_forbidden" ||
		!strings.Contains(e.Error.Message, "server.cors.allowed_origins") || !strings.Contains(e.Error.Message, "--cors-origin http://localhost:5173") {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
	if resp.Header.Get("X-Request-Id") == "" {
		t.Error("the refusal carries no X-Request-Id")
	}
	// A plain OPTIONS, not a preflight, is still a wrong method.
	req, _ = http.NewRequest(http.MethodOptions, gw+"/v1/chat/completions", nil)
	resp, err = httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("plain OPTIONS: %d", resp.StatusCode)
	}
}
