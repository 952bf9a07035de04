package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

// Regression tests of issue 12 ("hard edges"), items 4 to 9: each names the
// item it pins.

// counter is the value of one series of a counter vector.
func counter(v *prometheus.CounterVec, labels ...string) float64 {
	var m dto.Metric
	if err := v.WithLabelValues(labels...).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// requests is the count of finished requests with this outcome and reason.
func requests(gw *Server, outcome, reason string) int {
	return int(counter(gw.m.requests, "llama-3-8b", outcome, reason))
}

// onlyBackend is the gateway's one backend.
func onlyBackend(gw *Server) *backends.Backend { return gw.rt.Load().upstreams.Backends()[0] }

// writeSSE writes SSE events to w, flushing after each.
func writeSSE(w http.ResponseWriter, events ...string) {
	for _, e := range events {
		io.WriteString(w, e)
		w.(http.Flusher).Flush()
	}
}

const (
	tokenEvent = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" a\"},\"finish_reason\":null}]}\n\n"
	lastEvent  = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" b\"},\"finish_reason\":\"stop\"}]}\n\n"
	doneEvent  = "data: [DONE]\n\n"
)

func streamHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	w.(http.Flusher).Flush()
}

// Item 4: a request's own failure — here a backend that resets the
// connection while the body is being sent, and one that answers 4xx — never
// counts towards the circuit, however often one client repeats it; only
// failing to connect does. A body over the gateway's limit is refused with
// 413 before anything is forwarded.
func TestOneClientCannotOpenTheCircuit(t *testing.T) {
	var reached sync.Map // X-Request-Id → true
	url := startFake(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		if tokenize3(w, r) {
			return
		}
		id := r.Header.Get("X-Request-Id")
		reached.Store(id, true)
		switch {
		case strings.HasPrefix(id, "refuse"):
			// Refuse the body the way a server with a smaller limit does:
			// reset the connection without reading it.
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
		case strings.HasPrefix(id, "bad"):
			w.WriteHeader(400)
			io.WriteString(w, `{"object":"error","message":"no","type":"BadRequestError","code":400}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
		}
	}).URL
	// Probes off: only the passive signal can move the circuit (threshold 2).
	gw, gwURL := startGateway(t, baseConfig(url, "server: {max_body_bytes: 1MiB}\n"), Options{DisableProbes: true})
	big := chatBody(strings.Repeat("x", 512<<10), 5, false)
	for i := range 4 {
		r := postJSON(gwURL, "/v1/chat/completions", big, "X-Request-Id", fmt.Sprintf("refuse-%d", i))
		if r.status != 502 {
			t.Fatalf("refused body %d: %d %s", i, r.status, r.body)
		}
		if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 5, false), "X-Request-Id", fmt.Sprintf("bad-%d", i)); r.status != 400 {
			t.Fatalf("backend 400 %d: %d %s", i, r.status, r.body)
		}
	}
	if st := onlyBackend(gw).State(); st != backends.StateClosed {
		t.Fatalf("one client's failures opened the circuit: %s (%s)", st, onlyBackend(gw).LastError())
	}
	if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 5, false), "X-Request-Id", "ok"); r.status != 200 {
		t.Fatalf("another client after them: %d %s", r.status, r.body)
	}
	// Over the gateway's own limit: 413 on the declared length alone, and the
	// backend never sees it. (The headers go alone: the answer must not wait
	// for the body. That a client still sending one gets it too is
	// TestOversizedRequestGetsItsAnswer's.)
	c, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate\r\nX-Request-Id: huge\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 2<<20)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || decodeError(t, string(body)).Error.Code == nil {
		t.Fatalf("over max_body_bytes: %d %s", resp.StatusCode, body)
	}
	if _, ok := reached.Load("huge"); ok {
		t.Error("a body over max_body_bytes was forwarded")
	}
	eventually(t, "reservations to return", func() bool { return held(gw) == 0 })
}

// Item 4 (connect failures do count) — the passive signal that remains.
func TestConnectFailuresOpenTheCircuit(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	gw, gwURL := startGateway(t, baseConfig(dead, ""), Options{DisableProbes: true})
	for range 2 {
		postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 5, false))
	}
	if st := onlyBackend(gw).State(); st != backends.StateOpen {
		t.Fatalf("two refused connections: circuit %s", st)
	}
}

// Items 4 and 5: a backend that answers /health but never answers a
// completion — silent, or with headers and no event — gets 504s after
// backends[].first_byte_timeout (reservation released), and consecutive
// timeouts open its circuit, which passing health checks do not close.
// The timeout and the health checks' interval run on the gateway's clock,
// which the test moves.
func TestHangingBackendTripsTheCircuit(t *testing.T) {
	for _, mode := range []string{"silent", "headers only"} {
		t.Run(mode, func(t *testing.T) {
			var arrived atomic.Int64
			f := startFake(t, func(w http.ResponseWriter, r *http.Request, quit <-chan struct{}) {
				if tokenize3(w, r) {
					return
				}
				arrived.Add(1)
				if mode == "headers only" {
					streamHeaders(w)
				}
				select {
				case <-r.Context().Done():
				case <-quit:
				}
			})
			cfg := strings.Replace(baseConfig(f.URL, "server: {request_timeout: 60s}\n"), "cooldown: 200ms", "cooldown: 1h", 1)
			cfg = strings.Replace(cfg, "gpu_memory: 24GiB", "gpu_memory: 24GiB\n    first_byte_timeout: 30s", 1)
			clock := newClock()
			gw, gwURL := startGateway(t, cfg, Options{Clock: clock})
			eventually(t, "the first health check", func() bool { return f.health.Load() > 0 })
			for i := range 2 {
				answer := make(chan result, 1)
				go func() { answer <- postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 5, true)) }()
				// The first-byte deadline is set before the request is sent.
				eventually(t, "the backend to get the request", func() bool { return arrived.Load() == int64(i+1) })
				clock.Advance(30 * time.Second)
				var r result
				advanceUntil(t, clock, sweepTick, "the 504", func() bool {
					select {
					case r = <-answer:
						return true
					default:
						return false
					}
				})
				if r.status != 504 {
					t.Fatalf("request %d: %d %s", i, r.status, r.body)
				}
				if e := decodeError(t, r.body); e.Error.Code == nil || *e.Error.Code != "upstream_timeout" || !strings.Contains(e.Error.Message, `"gpu0"`) {
					t.Fatalf("request %d: %+v", i, e.Error)
				}
				// It goes back admission.abort_hold (1s) after the exchange was cut.
				advanceUntil(t, clock, time.Second, "the reservation to return", func() bool { return held(gw) == 0 })
			}
			if st := onlyBackend(gw).State(); st != backends.StateOpen {
				t.Fatalf("after 2 first-byte timeouts: circuit %s", st)
			}
			// Health checks keep passing; they must not close it.
			seen := f.health.Load()
			advanceUntil(t, clock, 50*time.Millisecond, "two more health checks", func() bool { return f.health.Load() >= seen+2 })
			if st := onlyBackend(gw).State(); st != backends.StateOpen {
				t.Fatalf("a passing health check closed a circuit that timeouts opened: %s", st)
			}
			if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 5, true)); r.status != 503 {
				t.Fatalf("with the circuit open: %d %s", r.status, r.body)
			}
			if n := requests(gw, outcomeFailed, "first_byte_timeout"); n != 2 {
				t.Errorf("%d requests counted as first_byte_timeout", n)
			}
		})
	}
}

// Item 5: /tokenize has its own short timeout; a slow or failing tokenizer
// makes the gateway estimate instead (and count it), not wait for the
// request's own timeout. The timeout runs on the gateway's clock, which the
// test moves.
func TestTokenizeTimeoutFallsBackToTheEstimate(t *testing.T) {
	for _, tc := range []struct {
		mode, reason string
		wait         time.Duration // on the clock, once the tokenizer has the call
	}{{"slow", "timeout", 30 * time.Second}, {"down", "error", 0}} {
		t.Run(tc.mode, func(t *testing.T) {
			asked := make(chan struct{}, 1)
			url := startFake(t, func(w http.ResponseWriter, r *http.Request, quit <-chan struct{}) {
				if r.URL.Path == "/tokenize" {
					asked <- struct{}{}
					if tc.mode == "down" {
						w.WriteHeader(500)
						return
					}
					select {
					case <-r.Context().Done():
					case <-quit:
					}
					return
				}
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
			}).URL
			cfg := strings.Replace(baseConfig(url, "server: {request_timeout: 60s}\n"), "gpu_memory: 24GiB", "gpu_memory: 24GiB\n    tokenize_timeout: 30s", 1)
			clock := newClock()
			gw, gwURL := startGateway(t, cfg, Options{Clock: clock})
			answer := make(chan result, 1)
			go func() { answer <- postJSON(gwURL, "/v1/chat/completions", chatBody("hello there", 5, false)) }()
			<-asked // the timeout is armed before the call is sent
			if tc.wait > 0 {
				clock.Advance(tc.wait)
			}
			if r := <-answer; r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if n := counter(gw.m.tokenizeFalls, "llama-3-8b", tc.reason); n != 1 {
				t.Errorf("kvgate_tokenize_fallbacks_total{reason=%q} = %v", tc.reason, n)
			}
		})
	}
}

// readUntil reads br until a line containing want, failing on EOF.
func readUntil(t *testing.T, br *bufio.Reader, want string) {
	t.Helper()
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before %q: %v", want, err)
		}
		if strings.Contains(line, want) {
			return
		}
	}
}

// Item 6: how a stream ends decides its outcome. [DONE] relayed is a
// success even if the client leaves at once (while the backend has not yet
// closed its side); a stream that ends without [DONE] or in the middle of an
// event gives the client a final error event on its own line and counts as
// failed; an event past server.max_sse_line_bytes ends the stream the same
// way without the gateway holding more than the bound.
func TestStreamEndings(t *testing.T) {
	url := startFake(t, func(w http.ResponseWriter, r *http.Request, quit <-chan struct{}) {
		if tokenize3(w, r) {
			return
		}
		body, _ := io.ReadAll(r.Body)
		streamHeaders(w)
		switch {
		case bytes.Contains(body, []byte("done-then-linger")):
			writeSSE(w, tokenEvent, lastEvent, doneEvent)
			select { // keep the stream open until the gateway lets go
			case <-r.Context().Done():
			case <-quit:
			}
		case bytes.Contains(body, []byte("no-done")):
			writeSSE(w, tokenEvent, lastEvent)
		case bytes.Contains(body, []byte("mid-event")):
			writeSSE(w, tokenEvent, `data: {"id":"c","object":"chat.comp`)
		case bytes.Contains(body, []byte("huge-line")):
			writeSSE(w, tokenEvent, "data: ")
			chunk := bytes.Repeat([]byte("a"), 64<<10)
			for range 256 { // 16 MiB without a newline, unless the gateway hangs up
				if _, err := w.Write(chunk); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		}
	}).URL
	gw, gwURL := startGateway(t, baseConfig(url, "server: {max_sse_line_bytes: 64KiB}\n"), Options{})

	t.Run("client leaves right after [DONE]", func(t *testing.T) {
		c, br := rawRequest(t, gwURL, "/v1/chat/completions", chatBody("done-then-linger", 5, true))
		readUntil(t, br, "data: [DONE]")
		eventually(t, "the blocks to return at [DONE], the backend's side still open", func() bool { return held(gw) == 0 })
		c.Close()
		eventually(t, "the request to finish", func() bool {
			return requests(gw, outcomeOK, "")+requests(gw, outcomeCanceled, "client_disconnect") == 1
		})
		if n := requests(gw, outcomeCanceled, "client_disconnect"); n != 0 {
			t.Fatalf("a stream that relayed [DONE] counted as canceled")
		}
	})
	for _, tc := range []struct{ name, marker, reason, notInBody string }{
		{"no [DONE]", "no-done", "upstream_incomplete", ""},
		{"closed mid-event", "mid-event", "upstream_incomplete", "chat.comp\n"},
		{"line past the bound", "huge-line", "upstream_event_too_large", "aaaa"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := requests(gw, outcomeFailed, tc.reason)
			r := postJSON(gwURL, "/v1/chat/completions", chatBody(tc.marker, 5, true))
			if r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if !strings.HasPrefix(r.body, tokenEvent) {
				t.Errorf("the first event was not relayed: %.200q", r.body)
			}
			i := strings.Index(r.body, "\n\ndata: {\"error\":")
			if i < 0 || !strings.HasSuffix(r.body, "\n\ndata: [DONE]\n\n") {
				t.Fatalf("no final error event on its own line: %.500q", r.body)
			}
			if tc.notInBody != "" && strings.Contains(r.body, tc.notInBody) {
				t.Errorf("the broken part reached the client: %.300q", r.body)
			}
			if len(r.body) > 64<<10 {
				t.Errorf("%d bytes relayed: the bound did not hold", len(r.body))
			}
			eventually(t, "the failure to be counted", func() bool { return requests(gw, outcomeFailed, tc.reason) == before+1 })
		})
	}
	eventually(t, "reservations to return", func() bool { return held(gw) == 0 })
}

// Item 7: the header limit is configurable, and past it the answer is 431
// in OpenAI's shape.
func TestHeaderLimit(t *testing.T) {
	url := startFake(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		if tokenize3(w, r) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	}).URL
	_, gwURL := startGateway(t, baseConfig(url, "server: {max_header_bytes: 32KiB}\n"), Options{})
	for _, tc := range []struct {
		size, status int
	}{{20 << 10, 200}, {40 << 10, 431}} {
		r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 5, false), "X-Padding", strings.Repeat("p", tc.size))
		if r.status != tc.status {
			t.Fatalf("%d-byte header: %d %.300s", tc.size, r.status, r.body)
		}
		if tc.status == 431 {
			if e := decodeError(t, r.body); e.Error.Code == nil || *e.Error.Code != "request_header_too_large" {
				t.Errorf("431 body: %s", r.body)
			}
		}
	}
}

// Item 8: an API key is never echoed in an error body nor logged, whatever
// the client sends; a 502 names the backend, not its address.
func TestSecretsStayInside(t *testing.T) {
	const secret = "sk-live-7f3a9c1e5b"
	const prompt = "my-private-prompt-3b1d" // nor a prompt, in the access log or elsewhere
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := ln.Addr().String()
	ln.Close()
	var logs syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	extra := "tenants: [{name: t, api_keys: [" + secret + "]}]\n"
	_, gwURL := startGateway(t, baseConfig("http://"+deadAddr, extra), Options{DisableProbes: true, Logger: logger})
	auth := "Bearer " + secret
	raw := func(req string) string {
		status, b := rawExchange(t, gwURL, req)
		return fmt.Sprintf("%d %s", status, b)
	}
	answers := map[string]string{
		"headers too large": raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth + "\r\nX-Pad: " + strings.Repeat("p", 20<<10) + "\r\n\r\n"),
		"malformed length":  raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth + "\r\nContent-Length: 12x\r\n\r\n"),
		"malformed line":    raw("POST /v1/chat/completions\r\nAuthorization: " + auth + "\r\n\r\n"),
		"unreachable":       raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth + "\r\nContent-Length: " + fmt.Sprint(len(chatBody(prompt, 5, false))) + "\r\n\r\n" + chatBody(prompt, 5, false)),
	}
	for name, a := range answers {
		if strings.Contains(a, secret) {
			t.Errorf("%s: the key was echoed: %.300s", name, a)
		}
		if !strings.Contains(a, `"error":{`) {
			t.Errorf("%s: not an OpenAI error: %.300s", name, a)
		}
	}
	if a := answers["unreachable"]; !strings.HasPrefix(a, "502 ") || !strings.Contains(a, `\"gpu0\"`) || strings.Contains(a, deadAddr) || strings.Contains(a, "127.0.0.1") {
		t.Errorf("502 should name the backend, not its address: %s", a)
	}
	if strings.Contains(logs.String(), secret) || strings.Contains(logs.String(), prompt) {
		t.Errorf("the key or the prompt was logged:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "msg=request") || !strings.Contains(logs.String(), "status=502") {
		t.Errorf("no access line for the 502 (log.access is on by default):\n%s", logs.String())
	}
}

// Item 8: with tenant keys, /v1/models needs one (clients check a key with
// models.list()); /status and /metrics need an admin key once one is set,
// and a tenant's key does not open them; probes stay open.
func TestKeysGuardModelsAndOperatorViews(t *testing.T) {
	_, url := startSim(t, nil)
	extra := "tenants: [{name: t, api_keys: [tenant-key]}]\nadmin: {api_keys: [admin-key]}\n"
	_, gwURL := startGateway(t, baseConfig(url, extra), Options{})
	get := func(path, key string) int {
		req, _ := http.NewRequest("GET", gwURL+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path, key string
		want      int
	}{
		{"/v1/models", "", 401}, {"/v1/models", "wrong", 401}, {"/v1/models", "tenant-key", 200},
		{"/v1/models/llama-3-8b", "", 401}, {"/v1/models/llama-3-8b", "tenant-key", 200},
		{"/status", "", 401}, {"/status", "tenant-key", 401}, {"/status", "admin-key", 200},
		{"/metrics", "", 401}, {"/metrics", "tenant-key", 401}, {"/metrics", "admin-key", 200},
		{"/healthz", "", 200}, {"/readyz", "", 200},
	} {
		if got := get(tc.path, tc.key); got != tc.want {
			t.Errorf("GET %s with key %q: %d, want %d", tc.path, tc.key, got, tc.want)
		}
	}
	client := openai.NewClient(option.WithBaseURL(gwURL+"/v1/"), option.WithAPIKey("wrong"), option.WithMaxRetries(0))
	var apiErr *openai.Error
	if _, err := client.Models.List(context.Background()); !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
		t.Errorf("models.list() with a wrong key: %v", err)
	}
}

// Item 9: GET /v1/models/{id}, the official clients' models.retrieve.
func TestModelsRetrieve(t *testing.T) {
	_, url := startSim(t, nil)
	_, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	client := openai.NewClient(option.WithBaseURL(gwURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	m, err := client.Models.Get(context.Background(), "llama-3-8b")
	if err != nil || m.ID != "llama-3-8b" || m.Object != "model" {
		t.Fatalf("models.retrieve: %+v %v", m, err)
	}
	var apiErr *openai.Error
	_, err = client.Models.Get(context.Background(), "gpt-9")
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model: %v", err)
	}
}

// Item 8: what fasthttp logs about a request it could not read loses the
// request's bytes and any credential.
func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, secret string }{
		{`error when reading request headers: cannot find whitespace in the first line of request "POST /x\r\nAuthorization: Bearer k1\r\n\r\n"`, "k1"},
		{`error when reading request headers: small read buffer. buffer size=4096, contents: "POST / HTTP/1.1\r\nAuthorization: Bearer k2"..."aaaa"`, "k2"},
		{`cannot parse "Authorization: Bearer k3"`, "k3"},
		{`header Authorization: Basic dXNlcjpwYXNz`, "dXNlcjpwYXNz"},
		{`proxy said bearer k5, then stopped`, "k5"},
		{`x-api-key: k6`, "k6"},
	} {
		if got := redact(tc.in); strings.Contains(got, tc.secret) {
			t.Errorf("redact(%q) = %q", tc.in, got)
		}
	}
	if got := redact(`error when serving connection "127.0.0.1:1"<->"127.0.0.1:2": i/o timeout`); !strings.Contains(got, "i/o timeout") || !strings.Contains(got, "127.0.0.1:2") {
		t.Errorf("redact removed what is safe: %q", got)
	}
}

// Item 9: a max_retry_after above what the official clients wait for would
// turn every 429 into a failure; it is refused at load.
func TestMaxRetryAfterAboveTheClientsCap(t *testing.T) {
	_, err := Parse([]byte("admission: {max_retry_after: 5m}\n"+minimal), ".")
	if err == nil || !strings.Contains(err.Error(), "admission.max_retry_after: 5m0s is above 2m0s") {
		t.Fatalf("err = %v", err)
	}
	if _, err := Parse([]byte("admission: {max_retry_after: 2m}\n"+minimal), "."); err != nil {
		t.Fatalf("2m is what openai-go still honours: %v", err)
	}
}
