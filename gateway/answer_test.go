package gateway

import (
	"fmt"
	"testing"

	"github.com/valyala/fastjson"
)

const vllmChatAnswer = `{"id":"chatcmpl-1","object":"chat.completion","created":1733000000,"model":"llama-3-8b",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello \"there\" {[","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],` +
	`"usage":{"prompt_tokens":26,"total_tokens":42,"completion_tokens":16,"prompt_tokens_details":null},"prompt_logprobs":null}`

// String is an answer as the tests compare it: a finish reason that is
// absent and one that is empty differ by hasFinish.
func (a answer) String() string {
	return fmt.Sprintf("{usage:%v %d/%d choices:%d finish:%v %q}", a.hasUsage, a.prompt, a.completion, a.choices, a.hasFinish, a.finish)
}

func TestReadAnswer(t *testing.T) {
	usage := func(p, c int) answer { return answer{hasUsage: true, prompt: p, completion: c} }
	with := func(a answer, choices int, finish string) answer {
		a.choices = choices
		if finish != "-" {
			a.finish, a.hasFinish = []byte(finish), true
		}
		return a
	}
	tests := []struct {
		name   string
		body   string
		want   answer
		ok     bool
		parsed bool // read by the parser, not the scan
	}{
		{name: "vLLM chat answer", body: vllmChatAnswer, want: with(usage(26, 16), 1, "length"), ok: true},
		{name: "completion answer", body: `{"choices":[{"index":0,"text":"x","finish_reason":"stop"}],"usage":{"completion_tokens":3,"prompt_tokens":5}}`,
			want: with(usage(5, 3), 1, "stop"), ok: true},
		{name: "pretty-printed", body: "{\n  \"usage\" : {\"prompt_tokens\" : 7 ,\n \"completion_tokens\":2 } ,\r\n\t\"choices\" : [ {\"finish_reason\" : \"stop\"} ]\n}\n",
			want: with(usage(7, 2), 1, "stop"), ok: true},
		{name: "no usage", body: `{"choices":[{"finish_reason":"stop"}]}`, want: with(answer{}, 1, "stop"), ok: true},
		{name: "usage null", body: `{"usage":null,"choices":[]}`, want: answer{}, ok: true},
		{name: "usage not an object", body: `{"usage":[1,2]}`, want: answer{}, ok: true},
		{name: "counts that are not integers", body: `{"usage":{"prompt_tokens":16.0,"completion_tokens":"16"}}`, want: usage(0, 0), ok: true},
		{name: "exponent and past int64", body: `{"usage":{"prompt_tokens":1e3,"completion_tokens":99999999999999999999}}`, want: usage(0, 0), ok: true},
		{name: "negative count", body: `{"usage":{"prompt_tokens":-4,"completion_tokens":0}}`, want: usage(-4, 0), ok: true},
		{name: "repeated usage: the first", body: `{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}`, want: usage(1, 0), ok: true, parsed: true},
		{name: "repeated count: the first", body: `{"usage":{"prompt_tokens":1,"prompt_tokens":2}}`, want: usage(1, 0), ok: true, parsed: true},
		{name: "two choices: the first's finish", body: `{"choices":[{"finish_reason":"stop"},{"finish_reason":"length"}]}`,
			want: with(answer{}, 2, "stop"), ok: true},
		{name: "finish null", body: `{"choices":[{"finish_reason":null}]}`, want: with(answer{}, 1, "-"), ok: true},
		{name: "finish not a string", body: `{"choices":[{"finish_reason":1}]}`, want: with(answer{}, 1, "-"), ok: true},
		{name: "choice not an object", body: `{"choices":["stop"]}`, want: with(answer{}, 1, "-"), ok: true},
		{name: "choices not an array", body: `{"choices":{"finish_reason":"stop"}}`, want: answer{}, ok: true},
		{name: "empty object", body: `{}`, want: answer{}, ok: true},
		// What only the parser reads right.
		{name: "top-level key with escapes", body: `{"us\u0061ge":{"prompt_tokens":9}}`, want: usage(9, 0), ok: true, parsed: true},
		{name: "count key with escapes", body: `{"usage":{"prompt_tok\u0065ns":9}}`, want: usage(9, 0), ok: true, parsed: true},
		{name: "finish key with escapes", body: `{"choices":[{"finish_r\u0065ason":"length"}]}`, want: with(answer{}, 1, "length"), ok: true, parsed: true},
		{name: "finish with escapes", body: `{"choices":[{"finish_reason":"l\u0065ngth"}]}`, want: with(answer{}, 1, "length"), ok: true, parsed: true},
		// Not an answer.
		{name: "array", body: `[{"usage":{"prompt_tokens":9}}]`, ok: false, parsed: true},
		{name: "truncated", body: `{"usage":{"prompt_tokens":9}`, ok: false, parsed: true},
		{name: "empty", body: ``, ok: false, parsed: true},
		{name: "broken at the top level", body: `{"usage":{"prompt_tokens":9} "choices":[]}`, ok: false, parsed: true},
	}
	var pp fastjson.ParserPool
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := readAnswer(&pp, []byte(tt.body))
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
			if ok && got.String() != tt.want.String() {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			if _, scanned := scanAnswer([]byte(tt.body)); scanned == tt.parsed {
				t.Fatalf("scan read it: %v, want %v", scanned, !tt.parsed)
			}
		})
	}
}

// The scan reads an answer the parser reads as the parser does, or leaves
// it to the parser.
func FuzzScanAnswer(f *testing.F) {
	for _, s := range []string{
		vllmChatAnswer,
		`{"usage":{"prompt_tokens":1,"prompt_tokens":2},"choices":[{"finish_reason":"stop"},{}]}`,
		`{"us\u0061ge":{"prompt_tokens":9},"choices":[{"finish_reason":"l\u0065ngth"}]}`,
		`{"usage":{"prompt_tokens":1e3,"completion_tokens":-0},"choices":"x"}`,
		"{ \"choices\" : [ [] , {\"finish_reason\":\"stop\"} ] }",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var p fastjson.Parser
		want, parsed := parseAnswer(&p, body)
		got, scanned := scanAnswer(body)
		if parsed && scanned && got.String() != want.String() {
			t.Fatalf("scan read %v, the parser %v, of %q", got, want, body)
		}
	})
}

func BenchmarkReadAnswer(b *testing.B) {
	body := []byte(vllmChatAnswer)
	b.Run("scan", func(b *testing.B) {
		var pp fastjson.ParserPool
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := readAnswer(&pp, body); !ok {
				b.Fatal("not read")
			}
		}
	})
	b.Run("parse", func(b *testing.B) {
		var p fastjson.Parser
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := parseAnswer(&p, body); !ok {
				b.Fatal("not read")
			}
		}
	})
}
