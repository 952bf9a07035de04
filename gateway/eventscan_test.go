package gateway

import (
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

// tokenOfChoice0 reports whether an event is one piece of text of choice 0
// and nothing more.
func tokenOfChoice0(data []byte) bool {
	c, ok := scanChoice0(data)
	return ok && c.tokenOnly()
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
		got, ok := scanChoice0([]byte(c.data))
		finish := none
		if got.finish != nil {
			finish = string(got.finish)
		}
		if ok != c.ok || ok && (got.text != c.text || finish != c.finish) {
			t.Errorf("scanChoice0(%s) = text %v finish %s ok %v, want text %v finish %s ok %v", c.data, got.text, finish, ok, c.text, c.finish, c.ok)
		}
		if want := c.ok && c.text && c.finish == none; tokenOfChoice0([]byte(c.data)) != want {
			t.Errorf("tokenOfChoice0(%s) = %v, want %v", c.data, !want, want)
		}
	}
}

// Whatever scanChoice0 reads, the parse the relay would otherwise do reads
// the same: one choice of index 0, with a token or not, finished or not,
// and nothing more.
func FuzzScanChoice0(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"index":0,"delta":{"content":" one"},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"length"}]}`,
		`{"choices":[{"index":0,"finish_reason":"stop"}],"usage":{"prompt_tokens":3}}`,
		`{"error":{"message":"x"}}`, `{"choices":[{"text":"\"finish_reason\":null"}]}`,
		`{"choices":[{"index":0,"text":" one","finish_reason":null}],"usage":null}`,
		`{"choices":[{"index":0,"delta":{"reasoning":"x","content":null},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"reasoning_content":"","tool_calls":[]}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, ok := scanChoice0(data)
		if !ok {
			return
		}
		v, err := fastjson.ParseBytes(data)
		if err != nil {
			return // a malformed event: the parse would act on nothing, the scan on what it read
		}
		if v.Get("error") != nil {
			t.Fatalf("read %s, which has an error", data)
		}
		if u := v.Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
			t.Fatalf("read %s, which has usage", data)
		}
		choices := v.GetArray("choices")
		if len(choices) != 1 || choices[0].GetInt("index") != 0 {
			t.Fatalf("read %s, which is not one choice of index 0", data)
		}
		ch := choices[0]
		n := generatedBytes(ch)
		if text := n > 0; text != c.text {
			t.Fatalf("read %s as text %v; the parse says %v", data, c.text, text)
		}
		// The bytes the relay counts of the scanned text are the text's
		// own (a delta may hold a reasoning beside its content: the scan
		// counts one of them).
		if c.text {
			if b := textBytes(data[c.start+1 : c.end-1]); b < 1 || b > n {
				t.Fatalf("read %s: %d bytes of text, the parse says %d", data, b, n)
			}
		}
		fr := ch.Get("finish_reason")
		if parsed := fr != nil && fr.Type() == fastjson.TypeString; parsed != (c.finish != nil) ||
			parsed && string(fr.GetStringBytes()) != string(c.finish) {
			t.Fatalf("read %s as finish %q; the parse says %s", data, c.finish, fr)
		}
	})
}

// A stream's token events are told by the shape of the last one passed:
// the same bytes around another non-empty string. Anything else is
// scanned, so the answer is always scanChoice0's.
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
			var shape tokenShape
			if got, ok := shape.choice0([]byte(pre + `" one"` + post)); !ok || !got.text {
				t.Fatal("the first event was not told")
			}
			if shape.pre != len(pre) || shape.post != len(post) {
				t.Fatalf("learned %d bytes before the text and %d after, want %d and %d", shape.pre, shape.post, len(pre), len(post))
			}
			got, ok := shape.choice0([]byte(c.data))
			want, wantOK := scanChoice0([]byte(c.data))
			if token := ok && got.text && got.finish == nil; token != c.want {
				t.Errorf("choice0(%s): a token %v, want %v", c.data, token, c.want)
			}
			if ok != wantOK || got.text != want.text || string(got.finish) != string(want.finish) || !sameText([]byte(c.data), got, want) {
				t.Errorf("choice0(%s) = %+v %v; scanChoice0 says %+v %v", c.data, got, ok, want, wantOK)
			}
		})
	}
}

// Whatever event a stream's shape was learned from, the next is read as
// scanChoice0 reads it.
func FuzzTokenShape(f *testing.F) {
	ev := cannedToken[len("data: ") : len(cannedToken)-2]
	f.Add(ev, []byte(strings.Replace(string(ev), `" one"`, `"\"two\""`, 1)))
	f.Add(ev, []byte(strings.Replace(string(ev), `" one"`, `""`, 1)))
	f.Add(ev, []byte(strings.Replace(string(ev), `" one"`, `"a"},"finish_reason":"stop","x":{"y":"b"`, 1)))
	f.Add([]byte(`{"choices":[{"index":0,"text":"a"}]}`), []byte(`{"choices":[{"index":0,"text":"bc"}]}`))
	f.Fuzz(func(t *testing.T, first, next []byte) {
		var shape tokenShape
		shape.choice0(first)
		got, ok := shape.choice0(next)
		want, wantOK := scanChoice0(next)
		if ok != wantOK || ok && (got.text != want.text || string(got.finish) != string(want.finish) || !sameText(next, got, want)) {
			t.Fatalf("after %s, choice0(%s) = %+v %v; scanChoice0 says %+v %v", first, next, got, ok, want, wantOK)
		}
	})
}

// BenchmarkTokenShape tells one vLLM token event of a stream whose shape
// is known.
func BenchmarkTokenShape(b *testing.B) {
	ev := cannedToken[len("data: ") : len(cannedToken)-2]
	var shape tokenShape
	shape.choice0(ev)
	b.ReportAllocs()
	for b.Loop() {
		if c, ok := shape.choice0(ev); !ok || !c.text {
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

// sameText says two readings of data find the same text, of the same kind
// (what a stream kept to be resumed copies).
func sameText(data []byte, a, b choice0) bool {
	if !a.text || !b.text {
		return a.text == b.text
	}
	return string(data[a.start:a.end]) == string(data[b.start:b.end]) && a.reasoning == b.reasoning
}
