package chunkscan

import (
	"strings"
	"testing"
)

// vllmToken is one token event of a vLLM chat stream, as it sends them.
var vllmToken = []byte(`{"id":"chatcmpl-46a01c94c88e6a44e53a518cfa44fc1c","object":"chat.completion.chunk","created":1796286500,"model":"llama-3-8b","choices":[{"index":0,"delta":{"content":" one"},"logprobs":null,"finish_reason":null,"stop_reason":null}]}`)

// tokenOfChoice0 reports whether an event is one piece of text of choice 0
// and nothing more.
func tokenOfChoice0(data []byte) bool {
	c, ok := Scan(data)
	return ok && c.TokenOnly()
}

func TestScanChoice0(t *testing.T) {
	const none = "-" // no finish reason
	for _, c := range []struct {
		data   string
		ok     bool
		text   bool
		finish string
	}{
		{`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" one"},"logprobs":null,"finish_reason":null,"stop_reason":null}]}`, true, true, none},
		{`{"id":"x","choices":[{"index":0,"text":" one","logprobs":null,"finish_reason":null}]}`, true, true, none},
		{` { "choices" : [ { "index" : 0 , "delta" : { "content" : "the \"usage\" key" , "tool_calls" : null } } ] , "usage" : null } `, true, true, none},
		{`{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null,"token_ids":[7]}]}`, true, true, none}, // unknown fields are ignored by the parse too
		{`{"choices":[{"index":0,"delta":{"content":""}}]}`, true, false, none},
		{`{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`, true, false, none},
		{`{"choices":[{"index":0,"delta":{"role":"assistant","content":"x"}}]}`, true, true, none},
		{`{"choices":[{"index":0,"delta":{"content":" end"},"finish_reason":"length"}]}`, true, true, "length"},
		{`{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}`, true, false, "stop"},
		{`{"choices":[{"index":0,"text":"","finish_reason":"length","stop_reason":null}]}`, true, false, "length"},
		{`{"choices":[{"index":0,"delta":{},"finish_reason":"le\u006egth"}]}`, false, false, none},
		{`{"choices":[{"index":0,"delta":{},"finish_reason":7}]}`, false, false, none},
		{`{"choices":[{"index":0,"delta":{"role":7}}]}`, false, false, none},
		{`{"choices":[{"index":0,"delta":{"content":null}}]}`, false, false, none},
		{`{"choices":[{"index":1,"delta":{"content":"x"}}]}`, false, false, none},
		{`{"choices":[{"index":1,"index":0,"delta":{"content":"x"}}]}`, false, false, none},
		{`{"choices":[{"index":0,"finish_reason":null,"finish_reason":"stop"}]}`, false, false, none},
		{`{"choices":[{"index":0,"delta":{"content":"x","content":""}}]}`, false, false, none},
		{`{"choices":[{"delta":{"content":"x"}}]}`, false, false, none},
		{`{"choices":[{"index":0,"delta":{"content":"x"}},{"index":1,"delta":{"content":"y"}}]}`, false, false, none},
		{`{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[{"token":"x"}]}}]}`, false, false, none},
		{`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}`, false, false, none},
		{`{"choices":[{"index":0,"delta":{"reasoning":" think"},"logprobs":null,"finish_reason":null}]}`, true, true, none},
		{`{"choices":[{"index":0,"delta":{"reasoning_content":" think"}}]}`, true, true, none},
		{`{"choices":[{"index":0,"delta":{"reasoning":" think","reasoning_content":" think"}}]}`, true, true, none},
		{`{"choices":[{"index":0,"delta":{"role":"assistant","reasoning":""}}]}`, true, false, none},
		{`{"choices":[{"index":0,"delta":{"reasoning":"x","reasoning":""}}]}`, false, false, none},
		{`{"choices":[{"index":0,"delta":{"reasoning":["x"]}}]}`, false, false, none},
		{`{"choices":[],"usage":{"prompt_tokens":1}}`, false, false, none},
		{`{"choices":[{"index":0,"text":"x"}],"usage":{"prompt_tokens":1}}`, false, false, none},
		{`{"choices":[{"index":0,"text":"x"}],"error":{"message":"boom"}}`, false, false, none},
		{`{"choices":[{"index":0,"text":"x"}],"choices":[]}`, false, false, none},
		{`{"ch\u006fices":[{"index":0,"text":"x"}]}`, false, false, none},
		{`{"x":{"choices":[{"index":0,"text":"0"}]}}`, false, false, none},
		{`{"":[{"index":0,"text":"0"}]}`, false, false, none},
		{`{"choices":[{"index":0,"text":"x"}]} trailing`, false, false, none},
		{`{"choices":[{"index":0,"text":"x"`, false, false, none},
	} {
		got, ok := Scan([]byte(c.data))
		finish := none
		if got.Finish != nil {
			finish = string(got.Finish)
		}
		if ok != c.ok || ok && (got.Text != c.text || finish != c.finish) {
			t.Errorf("Scan(%s) = text %v finish %s ok %v, want text %v finish %s ok %v", c.data, got.Text, finish, ok, c.text, c.finish, c.ok)
		}
		if want := c.ok && c.text && c.finish == none; tokenOfChoice0([]byte(c.data)) != want {
			t.Errorf("tokenOfChoice0(%s) = %v, want %v", c.data, !want, want)
		}
	}
}

// A stream's token events are told by the shape of the last one passed:
// the same bytes around another non-empty string. Anything else is
// scanned, so the answer is always Scan's.
func TestTokenShape(t *testing.T) {
	const pre, post = `{"id":"c1","created":7,"choices":[{"index":0,"delta":{"content":`, `},"finish_reason":null}]}`
	for _, c := range []struct {
		name string
		data string
		want bool // a token
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
			var shape Shape
			if got, ok := shape.Choice0([]byte(pre + `" one"` + post)); !ok || !got.Text {
				t.Fatal("the first event was not told")
			}
			if shape.pre != len(pre) || shape.post != len(post) {
				t.Fatalf("learned %d bytes before the text and %d after, want %d and %d", shape.pre, shape.post, len(pre), len(post))
			}
			got, ok := shape.Choice0([]byte(c.data))
			want, wantOK := Scan([]byte(c.data))
			if token := ok && got.Text && got.Finish == nil; token != c.want {
				t.Errorf("choice0(%s): a token %v, want %v", c.data, token, c.want)
			}
			if ok != wantOK || got.Text != want.Text || string(got.Finish) != string(want.Finish) || !sameText([]byte(c.data), got, want) {
				t.Errorf("choice0(%s) = %+v %v; Scan says %+v %v", c.data, got, ok, want, wantOK)
			}
		})
	}
}

// Whatever event a stream's shape was learned from, the next is read as
// Scan reads it.
func FuzzTokenShape(f *testing.F) {
	ev := vllmToken
	f.Add(ev, []byte(strings.Replace(string(ev), `" one"`, `"\"two\""`, 1)))
	f.Add(ev, []byte(strings.Replace(string(ev), `" one"`, `""`, 1)))
	f.Add(ev, []byte(strings.Replace(string(ev), `" one"`, `"a"},"finish_reason":"stop","x":{"y":"b"`, 1)))
	f.Add([]byte(`{"choices":[{"index":0,"text":"a"}]}`), []byte(`{"choices":[{"index":0,"text":"bc"}]}`))
	f.Fuzz(func(t *testing.T, first, next []byte) {
		var shape Shape
		shape.Choice0(first)
		got, ok := shape.Choice0(next)
		want, wantOK := Scan(next)
		if ok != wantOK || ok && (got.Text != want.Text || string(got.Finish) != string(want.Finish) || !sameText(next, got, want)) {
			t.Fatalf("after %s, choice0(%s) = %+v %v; Scan says %+v %v", first, next, got, ok, want, wantOK)
		}
	})
}

// BenchmarkTokenShape tells one vLLM token event of a stream whose shape
// is known.
func BenchmarkTokenShape(b *testing.B) {
	ev := vllmToken
	var shape Shape
	shape.Choice0(ev)
	b.ReportAllocs()
	for b.Loop() {
		if c, ok := shape.Choice0(ev); !ok || !c.Text {
			b.Fatal("a token event was not told")
		}
	}
}

// BenchmarkTokenOfChoice0 tells one vLLM token event from its bytes.
func BenchmarkTokenOfChoice0(b *testing.B) {
	ev := vllmToken
	b.ReportAllocs()
	for b.Loop() {
		if !tokenOfChoice0(ev) {
			b.Fatal("a token event was not told")
		}
	}
}

// sameText says two readings of data find the same text, of the same kind
// (what a stream kept to be resumed copies).
func sameText(data []byte, a, b Choice0) bool {
	if !a.Text || !b.Text {
		return a.Text == b.Text
	}
	return string(data[a.Start:a.End]) == string(data[b.Start:b.End]) && a.Reasoning == b.Reasoning
}
