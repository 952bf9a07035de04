package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// recorder is a fake backend that remembers what reached it: each proxied
// body and what the gateway held while it was being served. The gateway
// holds its reservation for the whole exchange, so the held bytes seen
// inside the handler are exactly the request's reservation.
type recorder struct {
	gw     atomic.Pointer[Server]
	bodies chan []byte
	held   chan int64
	// answer, when set, serves /v1/...; the default is a small JSON answer.
	answer func(w http.ResponseWriter, r *http.Request)
}

// fake is a fake vLLM on loopback: /health answers 200 (and is counted),
// /metrics nothing, and every other path goes to a handler (see tokenize3).
type fake struct {
	URL    string
	health atomic.Int64
}

// startFake serves h as a fake. quit closes when the test ends, before the
// server, so that handlers that wait can stop.
func startFake(t *testing.T, h func(w http.ResponseWriter, r *http.Request, quit <-chan struct{})) *fake {
	t.Helper()
	f := &fake{}
	quit := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			f.health.Add(1)
		case "/metrics":
		default:
			h(w, r, quit)
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(quit) })
	f.URL = srv.URL
	return f
}

// tokenize3 answers a /tokenize request: 3 tokens, whatever the prompt.
func tokenize3(w http.ResponseWriter, r *http.Request) bool {
	if r.URL.Path != "/tokenize" {
		return false
	}
	io.WriteString(w, `{"count":3,"max_model_len":8192,"tokens":[1,2,3]}`)
	return true
}

// startRecorder serves a recorder on loopback.
func startRecorder(t *testing.T) (*recorder, string) {
	t.Helper()
	rec := &recorder{bodies: make(chan []byte, 16), held: make(chan int64, 16)}
	f := startFake(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		if tokenize3(w, r) {
			return
		}
		b, _ := io.ReadAll(r.Body)
		if gw := rec.gw.Load(); gw != nil {
			rec.held <- held(gw)
		}
		rec.bodies <- b
		if rec.answer != nil {
			rec.answer(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"index":0,"text":"x","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	})
	return rec, f.URL
}

// blocksOf is the bytes one Llama-3-8B sequence of tokens reserves.
func blocksOf(tokens int) int64 { return int64((tokens+15)/16) * 16 * 131072 }

// Issue 12, items 1–3: the gateway reads a body as the backend will. The
// reservation follows the length field the endpoint generates by
// (completions: max_tokens), a duplicated field is refused rather than read
// one way by the gateway and the other by the backend, and numbers are
// integers as pydantic reads them, with anything past int64 a 400 naming
// the field instead of a 500.
func TestOneReadingOfTheBody(t *testing.T) {
	rec, url := startRecorder(t)
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	rec.gw.Store(gw)
	tests := []struct {
		name, path, body string
		// A 400 on param, or else the reservation (bytes) the backend was
		// served under.
		param string
		held  int64
		// check inspects the forwarded body.
		check func(map[string]any) bool
	}{
		// Item 1: /v1/completions generates max_tokens; the client's
		// max_completion_tokens must neither shrink the reservation nor
		// reach a backend that might honour it.
		{name: "completions reserve max_tokens", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_completion_tokens":1,"max_tokens":2000}`, held: blocksOf(3 + 2000),
			check: func(m map[string]any) bool {
				_, has := m["max_completion_tokens"]
				return !has && m["max_tokens"] == 2000.0
			}},
		{name: "chat: max_completion_tokens wins", path: "/v1/chat/completions",
			body: `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":100,"max_tokens":20}`, held: blocksOf(3 + 100)},
		// Item 2: duplicates of what the gateway reads.
		{name: "duplicate max_tokens", path: "/v1/chat/completions",
			body: `{"model":"llama-3-8b","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"max_tokens":5000}`, param: "max_tokens"},
		{name: "duplicate model", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":5,"model":"other"}`, param: "model"},
		{name: "duplicate model, escaped", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":5,"mod\u0065l":"other"}`, param: "model"},
		{name: "duplicate prompt", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":5,"prompt":"a much longer prompt"}`, param: "prompt"},
		{name: "duplicate content", path: "/v1/chat/completions",
			body: `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi","content":"longer"}],"max_tokens":5}`, param: "messages[0].content"},
		{name: "duplicate include_usage", path: "/v1/chat/completions",
			body: `{"model":"llama-3-8b","stream":true,"stream_options":{"include_usage":true,"include_usage":false},"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, param: "stream_options.include_usage"},
		{name: "an unread field may repeat", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":5,"temperature":1,"temperature":0}`, held: blocksOf(3 + 5)},
		// Item 3: numbers.
		{name: "max_tokens 2^63-1", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":9223372036854775807}`, param: "max_tokens"},
		{name: "max_tokens past int64", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":92233720368547758070}`, param: "max_tokens"},
		{name: "max_tokens 1e300", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":1e300}`, param: "max_tokens"},
		{name: "max_completion_tokens past the context", path: "/v1/chat/completions",
			body: `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":100000}`, param: "max_completion_tokens"},
		{name: "max_tokens 10.0 is 10", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":10.0}`, held: blocksOf(3 + 10)},
		{name: "max_tokens 1e2 is 100", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":1e2}`, held: blocksOf(3 + 100)},
		{name: "n 2.0 is 2", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":13,"n":2.0}`, held: blocksOf(3+13) * 2},
		{name: "max_tokens 10.5", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":10.5}`, param: "max_tokens"},
		{name: "n past int64", path: "/v1/completions",
			body: `{"model":"llama-3-8b","prompt":"hi","max_tokens":5,"n":1e19}`, param: "n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := postJSON(gwURL, tt.path, tt.body)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if tt.param != "" {
				if r.status != 400 {
					t.Fatalf("status %d, want 400 on %s: %s", r.status, tt.param, r.body)
				}
				if e := decodeError(t, r.body); e.Error.Param == nil || *e.Error.Param != tt.param {
					t.Fatalf("param %v, want %s: %s", e.Error.Param, tt.param, r.body)
				}
				return
			}
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if h := <-rec.held; h != tt.held {
				t.Errorf("served under a reservation of %d bytes, want %d", h, tt.held)
			}
			b := <-rec.bodies
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("forwarded body: %v: %s", err, b)
			}
			if tt.check != nil && !tt.check(m) {
				t.Errorf("forwarded body: %s", b)
			}
		})
	}
	if len(rec.bodies) != 0 {
		t.Errorf("%d refused requests reached the backend", len(rec.bodies))
	}
	eventually(t, "reservations to return", func() bool { return held(gw) == 0 })
}

// vLLM's include_usage defaults to true inside stream_options: a client
// that sends "stream_options":{} gets the usage chunk, as it would from the
// backend directly.
func TestStreamOptionsIncludeUsageDefault(t *testing.T) {
	_, url := startSim(t, nil)
	_, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	body := `{"model":"llama-3-8b","stream":true,"stream_options":{},"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
	r := postJSON(gwURL, "/v1/chat/completions", body)
	if r.status != 200 || !strings.Contains(r.body, `"completion_tokens":3`) {
		t.Fatalf("%d: %s", r.status, r.body)
	}
}

// The backend's Retry-After reaches the client (in whatever case the
// backend wrote it), on an answer and on a refusal (a prompt saying
// "refuse") alike; its other headers do not. X-Request-Id is the one the
// gateway sent the backend and logged, even where the backend answers
// another.
func TestBackendHeadersPassed(t *testing.T) {
	var sent sync.Map // the X-Request-Ids the backend was sent
	f := startFake(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		if tokenize3(w, r) {
			return
		}
		sent.Store(r.Header.Get("X-Request-Id"), true)
		w.Header()["retry-after"] = []string{"3"} // as uvicorn writes it
		w.Header()["x-request-id"] = []string{"req-7"}
		w.Header().Set("X-Internal", "secret")
		w.Header().Set("Content-Type", "application/json")
		if b, _ := io.ReadAll(r.Body); strings.Contains(string(b), "refuse") {
			w.WriteHeader(429)
			io.WriteString(w, `{"error":{"message":"busy","type":"rate_limit"}}`)
			return
		}
		io.WriteString(w, `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	})
	_, gwURL := startGateway(t, baseConfig(f.URL, ""), Options{DisableProbes: true})
	for _, refuse := range []string{"", "refuse"} {
		r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi "+refuse, 5, false))
		if want := map[string]int{"": 200, "refuse": 429}[refuse]; r.status != want {
			t.Fatalf("status %d, want %d: %s", r.status, want, r.body)
		}
		id := r.header.Get("X-Request-Id")
		if _, ok := sent.Load(id); !ok || r.header.Get("Retry-After") != "3" || r.header.Get("X-Internal") != "" {
			t.Errorf("refused=%q: headers %v", refuse, r.header)
		}
	}
}

// The client's request id and W3C trace context reach the backend, which
// continues the trace (vLLM's --otlp-traces-endpoint).
func TestTraceContextForwarded(t *testing.T) {
	got := make(chan http.Header, 1)
	url := startFake(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		if tokenize3(w, r) {
			return
		}
		got <- r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	}).URL
	_, gw := startGateway(t, baseConfig(url, ""), Options{DisableProbes: true})
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	r := postJSON(gw, "/v1/chat/completions", chatBody("hi", 5, false), "Traceparent", tp, "Tracestate", "vendor=x", "X-Request-Id", "r-1")
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	h := <-got
	if h.Get("Traceparent") != tp || h.Get("Tracestate") != "vendor=x" || h.Get("X-Request-Id") != "r-1" {
		t.Errorf("the backend got %v", h)
	}
}
