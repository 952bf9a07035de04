package gateway

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/valyala/fastjson"
)

// Which requests can be continued from their text, as parseRequest reads
// them: one streamed choice of a prompt given as text, output free of a
// grammar, the chat template the gateway's continuation assumes.
func TestResumable(t *testing.T) {
	const chat, cmpl = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]`, `{"model":"m","stream":true,"prompt":"hi"`
	for _, tc := range []struct {
		name string
		kind endpoint
		body string
		want bool
	}{
		{"chat", chatCompletions, chat + `}`, true},
		{"not streamed", chatCompletions, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, false},
		{"two choices", chatCompletions, chat + `,"n":2}`, false},
		{"best_of", chatCompletions, chat + `,"best_of":2}`, false},
		{"min_tokens: less what was generated", chatCompletions, chat + `,"min_tokens":5}`, true},
		{"ignore_eos", chatCompletions, chat + `,"ignore_eos":true}`, true},
		{"guided_json", chatCompletions, chat + `,"guided_json":{"type":"object"}}`, false},
		{"structured_outputs", chatCompletions, chat + `,"structured_outputs":{"regex":"a+"}}`, false},
		{"json_schema", chatCompletions, chat + `,"response_format":{"type":"json_schema"}}`, false},
		{"response_format text", chatCompletions, chat + `,"response_format":{"type":"text"}}`, true},
		{"guided_json null", chatCompletions, chat + `,"guided_json":null}`, true},
		{"the client continues its own message", chatCompletions, chat + `,"continue_final_message":true,"add_generation_prompt":false}`, false},
		{"no generation prompt", chatCompletions, chat + `,"add_generation_prompt":false}`, false},
		{"json_object", chatCompletions, chat + `,"response_format":{"type":"json_object"}}`, false},
		{"chat echo: the continuation would repeat the text", chatCompletions, chat + `,"echo":true}`, false},
		{"chat echo false", chatCompletions, chat + `,"echo":false}`, true},
		{"completion", completions, cmpl + `}`, true},
		{"echo", completions, cmpl + `,"echo":true}`, false},
		{"suffix", completions, cmpl + `,"suffix":"x"}`, false},
		{"token ids", completions, `{"model":"m","stream":true,"prompt":[1,2,3]}`, false},
		{"a list of one prompt", completions, `{"model":"m","stream":true,"prompt":["hi"]}`, false},
		{"two prompts", completions, `{"model":"m","stream":true,"prompt":["hi","ho"]}`, false},
	} {
		var p fastjson.Parser
		r, err := parseRequest(&p, []byte(tc.body), tc.kind)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if r.resumable != tc.want {
			t.Errorf("%s: resumable %v, want %v", tc.name, r.resumable, tc.want)
		}
	}
}

// The continuation of a stopped stream: the body sent, with the text
// generated (as the events carried it, escapes and all) after the prompt
// and the tokens left to generate.
func TestContinuation(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind endpoint
		sent string
		text string // as events carry it
		want map[string]any
	}{
		{"chat", chatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"stream":true,"stream_options":{"include_usage":true}}`,
			`Hello, \"world\"\n`,
			map[string]any{"model": "m", "max_tokens": 60.0, "stream": true, "stream_options": map[string]any{"include_usage": true},
				"messages":              []any{map[string]any{"role": "user", "content": "hi"}, map[string]any{"role": "assistant", "content": "Hello, \"world\"\n"}},
				"add_generation_prompt": false, "continue_final_message": true}},
		{"chat with both lengths", chatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"max_completion_tokens":90}`,
			`ok`,
			map[string]any{"model": "m", "max_tokens": 60.0, "max_completion_tokens": 60.0,
				"messages":              []any{map[string]any{"role": "user", "content": "hi"}, map[string]any{"role": "assistant", "content": "ok"}},
				"add_generation_prompt": false, "continue_final_message": true}},
		{"min_tokens less what was generated, ignore_eos kept", completions,
			`{"model":"m","prompt":"a","max_tokens":100,"min_tokens":50,"ignore_eos":true}`,
			`b`,
			map[string]any{"model": "m", "prompt": "ab", "max_tokens": 60.0, "min_tokens": 10.0, "ignore_eos": true}},
		{"completion without a length", completions,
			`{"model":"m","prompt":"Once upon","stream":true}`,
			` a time \u00e9`,
			map[string]any{"model": "m", "prompt": "Once upon a time é", "stream": true, "max_tokens": 60.0}},
		// Text Go's strconv would quote its own way (\a, \x01, \U000e0067:
		// not JSON) stays in JSON's escapes, in the text and in the prompt.
		{"chat: control characters and a flag's tag characters", chatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"bell\u0007"}]}`,
			`\u0001 \ud83c\udff4\udb40\udc67\udb40\udc62\udb40\udc73\udb40\udc63\udb40\udc74\udb40\udc7f`,
			map[string]any{"model": "m", "max_tokens": 60.0,
				"messages":              []any{map[string]any{"role": "user", "content": "bell\a"}, map[string]any{"role": "assistant", "content": "\x01 \U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F"}},
				"add_generation_prompt": false, "continue_final_message": true}},
		{"completion: control characters", completions,
			`{"model":"m","prompt":"bell\u0007\u000b"}`,
			`\u0001\ud83c\udff4\udb40\udc67`,
			map[string]any{"model": "m", "prompt": "bell\a\v\x01\U0001F3F4\U000E0067", "max_tokens": 60.0}},
	} {
		rs := newResumeState()
		rs.keep([]byte(tc.sent), headerMap{"X-Request-Id": "abc"})
		rs.capture([]byte(tc.text), false)
		out, err := rs.continuation(tc.kind, 60, 40)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s: %s: %v", tc.name, out, err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %v\nwant %v", tc.name, got, tc.want)
		}
		if h := string(rs.Peek("X-Request-Id")); h != "abc" || len(rs.Peek("Traceparent")) != 0 {
			t.Errorf("%s: headers kept %q", tc.name, h)
		}
		rs.free()
	}
}

// What a stream generated that its text cannot carry makes it one that is
// cut rather than resumed.
func TestCaptureRefusesWhatTextCannotCarry(t *testing.T) {
	for _, tc := range []struct {
		name, choice string
		broken       bool
		text         string
	}{
		{"content", `{"index":0,"delta":{"content":"a\"b"}}`, false, `a\"b`},
		{"completion text", `{"index":0,"text":"x\ny"}`, false, `x\ny`},
		{"tool call", `{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}`, true, ""},
		{"reasoning", `{"index":0,"delta":{"reasoning":"hmm"}}`, true, ""},
	} {
		rs := newResumeState()
		rs.captureParsed(fastjson.MustParse(tc.choice))
		if rs.broken != tc.broken || string(rs.text.B) != tc.text {
			t.Errorf("%s: broken %v text %q, want %v %q", tc.name, rs.broken, rs.text.B, tc.broken, tc.text)
		}
		rs.free()
	}
	rs := newResumeState()
	if rs.capture([]byte("think"), true); !rs.broken || rs.capturing() {
		t.Errorf("reasoning from the scan: broken %v", rs.broken)
	}
	rs.free()
}

type headerMap map[string]string

func (h headerMap) Peek(k string) []byte { return []byte(h[k]) }
