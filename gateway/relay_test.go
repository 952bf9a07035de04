package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"
)

// serveInProcess runs one request through the gateway's handler without a
// client connection, so that a test decides what becomes of the response.
func serveInProcess(s *Server, path, body string) *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(path)
	req.Header.SetContentType("application/json")
	req.SetBodyString(body)
	ctx := &fasthttp.RequestCtx{}
	ctx.Init(&req, nil, nil)
	s.handle(ctx)
	return ctx
}

func requestsTotal(s *Server, outcome, reason string) float64 {
	var m dto.Metric
	if err := s.m.requests.WithLabelValues("llama-3-8b", outcome, reason).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// A stream whose body fasthttp never writes (the client went away before
// the headers) still finishes its exchange: the reservation goes back and
// the request counts as canceled.
func TestStreamNeverWrittenReleases(t *testing.T) {
	_, url := startSim(t, nil)
	s, _ := startGateway(t, baseConfig(url, ""), Options{})
	ctx := serveInProcess(s, "/v1/chat/completions", chatBody("hi", 50, true))
	if _, ok := ctx.Response.BodyStream().(*sseBody); !ok || held(s) == 0 {
		t.Fatalf("want a streamed body holding a reservation; body %T, held %d", ctx.Response.BodyStream(), held(s))
	}
	if err := ctx.Response.CloseBodyStream(); err != nil {
		t.Fatal(err)
	}
	if h := held(s); h != 0 {
		t.Errorf("held %d after the body was closed unwritten", h)
	}
	if n := requestsTotal(s, outcomeCanceled, "client_disconnect"); n != 1 {
		t.Errorf("canceled requests = %g, want 1", n)
	}
}

// Should fasthttp read the body instead of letting it write itself, the
// relay runs behind a pipe and the client gets the same stream.
func TestStreamReadFallback(t *testing.T) {
	_, url := startSim(t, nil)
	s, _ := startGateway(t, baseConfig(url, ""), Options{})
	ctx := serveInProcess(s, "/v1/chat/completions", chatBody("hi", 5, true))
	body, ok := ctx.Response.BodyStream().(*sseBody)
	if !ok {
		t.Fatalf("body is %T", ctx.Response.BodyStream())
	}
	b, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.Response.CloseBodyStream(); err != nil {
		t.Fatal(err)
	}
	out := string(b)
	if strings.Count(out, `"delta"`) < 5 || !strings.HasSuffix(out, "data: [DONE]\n\n") || strings.Contains(out, `"usage"`) {
		t.Errorf("stream read through the fallback:\n%s", out)
	}
	if h := held(s); h != 0 {
		t.Errorf("held %d after the stream ended", h)
	}
	if n := requestsTotal(s, outcomeOK, ""); n != 1 {
		t.Errorf("ok requests = %g, want 1", n)
	}
}

// A reasoning model's stream is mostly reasoning, and a tool call's is
// arguments: both are output the backend holds KV blocks for. The relay
// counts every event that carries some (vLLM's "reasoning", its former
// "reasoning_content", a piece of a tool call, content), so the finished
// sequence teaches the predictor its whole length, not its content's.
func TestStreamCountsReasoningAndToolCalls(t *testing.T) {
	chunk := func(delta, finish string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"llama-3-8b","choices":[{"index":0,"delta":` +
			delta + `,"logprobs":null,"finish_reason":` + finish + "}]}\n\n"
	}
	var events []string
	events = append(events, chunk(`{"role":"assistant","content":""}`, "null"))
	for range 5 {
		events = append(events, chunk(`{"reasoning":" think"}`, "null"))
	}
	for range 3 {
		events = append(events, chunk(`{"reasoning_content":" hmm"}`, "null"))
	}
	events = append(events,
		chunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"weather","arguments":""}}]}`, "null"),
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Oslo\"}"}}]}`, "null"))
	for range 4 {
		events = append(events, chunk(`{"content":" a"}`, "null"))
	}
	events = append(events, chunk(`{"content":""}`, `"tool_calls"`), doneEvent)
	const want = 5 + 3 + 2 + 4

	url := startFake(t, func(w http.ResponseWriter, r *http.Request, quit <-chan struct{}) {
		if tokenize3(w, r) {
			return
		}
		streamHeaders(w)
		writeSSE(w, events...)
	}).URL
	_, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	r := postJSON(gwURL, "/v1/chat/completions", chatBody("what is the weather in Oslo", 100, true))
	if r.status != 200 || !strings.HasSuffix(r.body, doneEvent) {
		t.Fatalf("%d %.300q", r.status, r.body)
	}
	if q := getStatus(t, gwURL).Models[0]; q.Samples != 1 || q.MedianLength != want {
		t.Fatalf("the predictor learned %d tokens from %v samples, want %d from 1", q.MedianLength, q.Samples, want)
	}
}
