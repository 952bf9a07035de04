package gateway

import (
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

func TestTokenOfChoice0(t *testing.T) {
	for _, c := range []struct {
		data string
		want bool
	}{
		{`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" one"},"logprobs":null,"finish_reason":null,"stop_reason":null}]}`, true},
		{`{"id":"x","choices":[{"index":0,"text":" one","logprobs":null,"finish_reason":null}]}`, true},
		{` { "choices" : [ { "index" : 0 , "delta" : { "content" : "the \"usage\" key" , "tool_calls" : null } } ] , "usage" : null } `, true},
		{`{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null,"token_ids":[7]}]}`, true}, // unknown fields are ignored by the parse too
		{`{"choices":[{"index":0,"delta":{"content":""}}]}`, false},
		{`{"choices":[{"index":0,"delta":{"role":"assistant","content":"x"}}]}`, false},
		{`{"choices":[{"index":0,"delta":{"content":" end"},"finish_reason":"length"}]}`, false},
		{`{"choices":[{"index":1,"delta":{"content":"x"}}]}`, false},
		{`{"choices":[{"delta":{"content":"x"}}]}`, false},
		{`{"choices":[{"index":0,"delta":{"content":"x"}},{"index":1,"delta":{"content":"y"}}]}`, false},
		{`{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[{"token":"x"}]}}]}`, false},
		{`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}`, false},
		{`{"choices":[],"usage":{"prompt_tokens":1}}`, false},
		{`{"choices":[{"index":0,"text":"x"}],"usage":{"prompt_tokens":1}}`, false},
		{`{"choices":[{"index":0,"text":"x"}],"error":{"message":"boom"}}`, false},
		{`{"choices":[{"index":0,"text":"x"}],"choices":[]}`, false},
		{`{"ch\u006fices":[{"index":0,"text":"x"}]}`, false},
		{`{"x":{"choices":[{"index":0,"text":"0"}]}}`, false},
		{`{"":[{"index":0,"text":"0"}]}`, false},
		{`{"choices":[{"index":0,"text":"x"}]} trailing`, false},
		{`{"choices":[{"index":0,"text":"x"`, false},
	} {
		if got := tokenOfChoice0([]byte(c.data)); got != c.want {
			t.Errorf("tokenOfChoice0(%s) = %v, want %v", c.data, got, c.want)
		}
	}
}

// Whatever tokenOfChoice0 passes, the parse the relay would otherwise do
// reads as one token of choice 0 and nothing more.
func FuzzTokenOfChoice0(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"index":0,"delta":{"content":" one"},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"finish_reason":"stop"}],"usage":{"prompt_tokens":3}}`,
		`{"error":{"message":"x"}}`, `{"choices":[{"text":"\"finish_reason\":null"}]}`,
		`{"choices":[{"index":0,"text":" one","finish_reason":null}],"usage":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !tokenOfChoice0(data) {
			return
		}
		v, err := fastjson.ParseBytes(data)
		if err != nil {
			return // a malformed event: the parse would count nothing, this one token
		}
		if v.Get("error") != nil {
			t.Fatalf("passed %s, which has an error", data)
		}
		if u := v.Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
			t.Fatalf("passed %s, which has usage", data)
		}
		choices := v.GetArray("choices")
		if len(choices) != 1 || choices[0].GetInt("index") != 0 {
			t.Fatalf("passed %s, which is not one choice of index 0", data)
		}
		c := choices[0]
		if fr := c.Get("finish_reason"); fr != nil && fr.Type() == fastjson.TypeString {
			t.Fatalf("passed %s, whose finish_reason is %s", data, fr)
		}
		if len(c.GetStringBytes("delta", "content")) == 0 && len(c.GetStringBytes("text")) == 0 {
			t.Fatalf("passed %s, which has no text", data)
		}
	})
}

// A stream's token events are told by the shape of the last one passed:
// the same bytes around another non-empty string. Anything else is
// scanned, so the answer is always tokenOfChoice0's.
func TestTokenShape(t *testing.T) {
	const pre, post = `{"id":"c1","created":7,"choices":[{"index":0,"delta":{"content":`, `},"finish_reason":null}]}`
	for _, c := range []struct {
		name string
		data string
		want bool
	}{
		{"another text", pre + `" two"` + post, true},
		{"escapes in the text", pre + `"\"\u0041\n"` + post, true},
		{"empty text", pre + `""` + post, false},
		{"text not a string", pre + `7` + post, false},
		{"text not closed", pre + `"a` + post, false},
		{"a finish reason in the text's place", pre + `"a"},"finish_reason":"stop","x":{"y":"b"` + post, false},
		{"a second choice in the text's place", pre + `"a"}},{"index":1,"delta":{"content":"b"` + post, false},
		{"another id: scanned", `{"id":"c2","created":7,"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`, true},
		{"a finish: scanned", `{"id":"c1","created":7,"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}`, false},
		{"trailing bytes", pre + `"a"` + post + ` x`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var shape tokenShape
			if !shape.token([]byte(pre + `" one"` + post)) {
				t.Fatal("the first event was not told")
			}
			if shape.pre != len(pre) || shape.post != len(post) {
				t.Fatalf("learned %d bytes before the text and %d after, want %d and %d", shape.pre, shape.post, len(pre), len(post))
			}
			if got := shape.token([]byte(c.data)); got != c.want || got != tokenOfChoice0([]byte(c.data)) {
				t.Errorf("token(%s) = %v, want %v", c.data, got, c.want)
			}
		})
	}
}

// Whatever event a stream's shape was learned from, the next is told as
// tokenOfChoice0 tells it.
func FuzzTokenShape(f *testing.F) {
	ev := cannedToken[len("data: ") : len(cannedToken)-2]
	f.Add(ev, []byte(strings.Replace(string(ev), `" one"`, `"\"two\""`, 1)))
	f.Add(ev, []byte(strings.Replace(string(ev), `" one"`, `""`, 1)))
	f.Add(ev, []byte(strings.Replace(string(ev), `" one"`, `"a"},"finish_reason":"stop","x":{"y":"b"`, 1)))
	f.Add([]byte(`{"choices":[{"index":0,"text":"a"}]}`), []byte(`{"choices":[{"index":0,"text":"bc"}]}`))
	f.Fuzz(func(t *testing.T, first, next []byte) {
		var shape tokenShape
		shape.token(first)
		if got, want := shape.token(next), tokenOfChoice0(next); got != want {
			t.Fatalf("after %s, token(%s) = %v; tokenOfChoice0 says %v", first, next, got, want)
		}
	})
}

// BenchmarkTokenShape tells one vLLM token event of a stream whose shape
// is known.
func BenchmarkTokenShape(b *testing.B) {
	ev := cannedToken[len("data: ") : len(cannedToken)-2]
	var shape tokenShape
	shape.token(ev)
	b.ReportAllocs()
	for b.Loop() {
		if !shape.token(ev) {
			b.Fatal("a token event was not told")
		}
	}
}

// BenchmarkTokenOfChoice0 tells one vLLM token event from its bytes.
func BenchmarkTokenOfChoice0(b *testing.B) {
	ev := cannedToken[len("data: ") : len(cannedToken)-2]
	b.ReportAllocs()
	for b.Loop() {
		if !tokenOfChoice0(ev) {
			b.Fatal("a token event was not told")
		}
	}
}
