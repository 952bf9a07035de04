package gateway

import (
	"bytes"
	"io"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
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

func TestPlainToken(t *testing.T) {
	for _, c := range []struct {
		data  string
		plain bool
	}{
		{`{"id":"x","choices":[{"index":0,"delta":{"content":" one"},"logprobs":null,"finish_reason":null,"stop_reason":null}]}`, true},
		{`{"choices":[{"index":0,"text":"a","finish_reason" : null},{"index":1,"text":"b","finish_reason":null}]}`, true},
		{`{"choices":[{"index":0,"delta":{"content":"the \"usage\" key"}}]}`, true},
		{`{"choices":[{"index":0,"delta":{"content":" end"},"finish_reason":"length"}]}`, false},
		{`{"choices":[{"index":0,"finish_reason":null},{"index":1,"finish_reason":"stop"}]}`, false},
		{`{"choices":[],"usage":{"prompt_tokens":1}}`, false},
		{`{"error":{"message":"boom"}}`, false},
		{`{"object":"error","message":"boom"}`, false},
		{`{"choices":[{"delta":{"content":"he said \"usage"}}]}`, false}, // a false positive: parsed, harmlessly
		{`{"choices":[{"finish_reason"`, false},
	} {
		if got := plainToken([]byte(c.data)); got != c.plain {
			t.Errorf("plainToken(%s) = %v, want %v", c.data, got, c.plain)
		}
	}
}

func TestFirstChoiceToken(t *testing.T) {
	for _, c := range []struct {
		data string
		want bool
	}{
		{`{"id":"x","choices":[{"index":0,"delta":{"content":" one"},"logprobs":null,"finish_reason":null}]}`, true},
		{`{"id":"x","choices":[{"index":0,"text":" one","logprobs":null,"finish_reason":null}]}`, true},
		{`{"choices":[{"index":0,"delta":{"content":"\"q"}}]}`, true},
		{`{"choices":[{"index":0,"delta":{"content":""}}]}`, false},
		{`{"choices":[{"index":0,"delta":{"role":"assistant","content":"x"}}]}`, false}, // another layout: parsed
		{`{"choices":[{"index":1,"delta":{"content":"x"}}]}`, false},
		{`{"choices":[{"index":0,"delta":{"content":"x"}},{"index":1,"delta":{"content":"y"}}]}`, false},
		{`{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[{"token":"x"}]}}]}`, false},
		{`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}`, false},
		{`{"choices":[{"index":0,"delta":{"content": "x"}}]}`, false},
		{`{"other":[{"index":0,"text":"0"}]}`, false},
		{`{"x":{"choices":[{"index":0,"text":"0"}]}}`, false},
	} {
		if got := firstChoiceToken([]byte(c.data)); got != c.want {
			t.Errorf("firstChoiceToken(%s) = %v, want %v", c.data, got, c.want)
		}
	}
}

// Whatever plainToken passes over without parsing holds nothing inspect
// acts on beyond tokens, and what firstChoiceToken counts as one token of
// choice 0 is exactly that.
func FuzzPlainToken(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"index":0,"delta":{"content":" one"},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"finish_reason":"stop"}],"usage":{"prompt_tokens":3}}`,
		`{"error":{"message":"x"}}`, `{"choices":[{"text":"\"finish_reason\":null"}]}`,
		`{"choices":[{"index":0,"text":" one","finish_reason":null}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !plainToken(data) || bytes.Contains(data, []byte(`\u`)) {
			return
		}
		v, err := fastjson.ParseBytes(data)
		if err != nil {
			return
		}
		if v.Get("error") != nil || v.Get("usage") != nil {
			t.Fatalf("plainToken passed %s, which has an error or usage", data)
		}
		choices := v.GetArray("choices")
		for _, c := range choices {
			if fr := c.Get("finish_reason"); fr != nil && fr.Type() != fastjson.TypeNull {
				t.Fatalf("plainToken passed %s, whose finish_reason is %s", data, fr)
			}
		}
		if !firstChoiceToken(data) {
			return
		}
		if len(choices) != 1 || choices[0].GetInt("index") != 0 ||
			len(choices[0].GetStringBytes("delta", "content")) == 0 && len(choices[0].GetStringBytes("text")) == 0 {
			t.Fatalf("firstChoiceToken passed %s, which is not one token of choice 0", data)
		}
	})
}
