package gateway

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name  string
		kind  endpoint
		body  string
		want  request // kind and tokenize are not compared
		param string  // a 400 on this parameter
	}{
		{name: "chat minimal", kind: chatCompletions,
			body: `{"model":"m","messages":[{"role":"user","content":"hello"}]}`,
			want: request{model: "m", n: 1, shapes: []promptShape{{textBytes: 5, messages: 1}}}},
		{name: "chat full", kind: chatCompletions,
			body: `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":50,"n":3,
				"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			want: request{model: "m", stream: true, includeUsage: true, maxTokens: 50, maxTokensParam: "max_completion_tokens", n: 3, shapes: []promptShape{{textBytes: 12, messages: 2, images: 1}}}},
		{name: "max_completion_tokens wins", kind: chatCompletions,
			body: `{"model":"m","max_tokens":10,"max_completion_tokens":20,"messages":[{"role":"user","content":""}]}`,
			want: request{model: "m", maxTokens: 20, maxTokensParam: "max_completion_tokens", n: 1, shapes: []promptShape{{messages: 1}}}},
		{name: "nulls are absent", kind: chatCompletions,
			body: `{"model":"m","max_tokens":null,"n":null,"stream":null,"stream_options":null,"messages":[{"role":"assistant","content":null}]}`,
			want: request{model: "m", n: 1, shapes: []promptShape{{messages: 1}}}},
		{name: "best_of runs more sequences", kind: completions,
			body: `{"model":"m","prompt":"hi","n":2,"best_of":5}`,
			want: request{kind: completions, model: "m", n: 2, seqs: 5, shapes: []promptShape{{textBytes: 2}}}},
		{name: "completions read max_tokens only", kind: completions,
			body: `{"model":"m","prompt":"x","max_completion_tokens":1,"max_tokens":900}`,
			want: request{kind: completions, model: "m", maxTokens: 900, maxTokensParam: "max_tokens", dropMaxCompletion: true, n: 1, shapes: []promptShape{{textBytes: 1}}}},
		{name: "completions without max_tokens", kind: completions,
			body: `{"model":"m","prompt":"x","max_completion_tokens":1}`,
			want: request{kind: completions, model: "m", dropMaxCompletion: true, n: 1, shapes: []promptShape{{textBytes: 1}}}},
		{name: "integral floats are integers", kind: completions,
			body: `{"model":"m","prompt":"x","max_tokens":10.0,"n":2e0,"best_of":3.00}`,
			want: request{kind: completions, model: "m", maxTokens: 10, maxTokensParam: "max_tokens", n: 2, seqs: 3, shapes: []promptShape{{textBytes: 1}}}},
		{name: "empty stream_options asks for usage", kind: chatCompletions,
			body: `{"model":"m","stream":true,"stream_options":{},"messages":[{"role":"user","content":""}]}`,
			want: request{model: "m", stream: true, includeUsage: true, n: 1, shapes: []promptShape{{messages: 1}}}},
		{name: "a repeated unread field", kind: chatCompletions,
			body: `{"model":"m","top_p":1,"top_p":0.5,"messages":[{"role":"user","content":"","name":"a","name":"b"}]}`,
			want: request{model: "m", n: 1, shapes: []promptShape{{messages: 1}}}},
		{name: "ignore_eos pins the length", kind: completions,
			body: `{"model":"m","prompt":"x","max_tokens":7,"ignore_eos":true}`,
			want: request{kind: completions, model: "m", maxTokens: 7, maxTokensParam: "max_tokens", n: 1, pinned: true, shapes: []promptShape{{textBytes: 1}}}},
		{name: "min_tokens pins the length", kind: chatCompletions,
			body: `{"model":"m","max_tokens":70,"min_tokens":70,"messages":[{"role":"user","content":""}]}`,
			want: request{model: "m", maxTokens: 70, maxTokensParam: "max_tokens", n: 1, pinned: true, shapes: []promptShape{{messages: 1}}}},
		{name: "min_tokens 0 and ignore_eos false pin nothing", kind: completions,
			body: `{"model":"m","prompt":"x","min_tokens":0,"ignore_eos":false,"min_tokens_extra":5}`,
			want: request{kind: completions, model: "m", n: 1, shapes: []promptShape{{textBytes: 1}}}},
		{name: "completion string", kind: completions,
			body: `{"model":"m","prompt":"héllo","max_tokens":7}`,
			want: request{kind: completions, model: "m", maxTokens: 7, maxTokensParam: "max_tokens", n: 1, shapes: []promptShape{{textBytes: 6}}}},
		{name: "completion batch", kind: completions,
			body: `{"model":"m","prompt":["a","bcd"]}`,
			want: request{kind: completions, model: "m", n: 1, shapes: []promptShape{{textBytes: 1}, {textBytes: 3}}}},
		{name: "completion token ids", kind: completions,
			body: `{"model":"m","prompt":[1,2,3,4]}`,
			want: request{kind: completions, model: "m", n: 1, shapes: []promptShape{{tokenIDs: 4, ids: true}}}},
		{name: "completion batch of token ids", kind: completions,
			body: `{"model":"m","prompt":[[1,2],[3]]}`,
			want: request{kind: completions, model: "m", n: 1, shapes: []promptShape{{tokenIDs: 2, ids: true}, {tokenIDs: 1, ids: true}}}},
		{name: "unknown fields ignored", kind: chatCompletions,
			body: `{"model":"m","temperature":2,"tools":[{"type":"function"}],"messages":[{"role":"user","content":"x"}]}`,
			want: request{model: "m", n: 1, shapes: []promptShape{{textBytes: 1 + len(`[{"type":"function"}]`), messages: 1, tools: 1}}}},

		{name: "not json", kind: chatCompletions, body: `{`, param: "-"},
		{name: "array", kind: chatCompletions, body: `[]`, param: "-"},
		{name: "model number", kind: chatCompletions, body: `{"model":1,"messages":[]}`, param: "model"},
		{name: "model empty", kind: chatCompletions, body: `{"model":"","messages":[]}`, param: "model"},
		{name: "messages object", kind: chatCompletions, body: `{"model":"m","messages":{}}`, param: "messages"},
		{name: "message not object", kind: chatCompletions, body: `{"model":"m","messages":["hi"]}`, param: "messages[0]"},
		{name: "content number", kind: chatCompletions, body: `{"model":"m","messages":[{"role":"user","content":5}]}`, param: "messages[0].content"},
		{name: "max_tokens negative", kind: chatCompletions, body: `{"model":"m","max_tokens":-1,"messages":[{"role":"user","content":"x"}]}`, param: "max_tokens"},
		{name: "max_tokens float", kind: completions, body: `{"model":"m","max_tokens":1.5,"prompt":"x"}`, param: "max_tokens"},
		{name: "n too big", kind: completions, body: `{"model":"m","n":1000,"prompt":"x"}`, param: "n"},
		{name: "stream_options string", kind: completions, body: `{"model":"m","stream_options":"x","prompt":"x"}`, param: "stream_options"},
		{name: "include_usage string", kind: completions, body: `{"model":"m","stream_options":{"include_usage":"yes"},"prompt":"x"}`, param: "stream_options.include_usage"},
		{name: "continuous_usage_stats string", kind: completions, body: `{"model":"m","stream_options":{"continuous_usage_stats":"yes"},"prompt":"x"}`, param: "stream_options.continuous_usage_stats"},
		{name: "prompt empty array", kind: completions, body: `{"model":"m","prompt":[]}`, param: "prompt"},
		{name: "prompt mixed batch", kind: completions, body: `{"model":"m","prompt":["a",1]}`, param: "prompt[1]"},
		{name: "prompt object", kind: completions, body: `{"model":"m","prompt":{}}`, param: "prompt"},
		{name: "duplicate model", kind: completions, body: `{"model":"m","prompt":"x","model":"n"}`, param: "model"},
		{name: "duplicate max_tokens", kind: completions, body: `{"max_tokens":1,"model":"m","prompt":"x","max_tokens":2}`, param: "max_tokens"},
		{name: "duplicate max_completion_tokens", kind: chatCompletions, body: `{"max_completion_tokens":1,"model":"m","messages":[],"max_completion_tokens":2}`, param: "max_completion_tokens"},
		{name: "duplicate n", kind: completions, body: `{"n":1,"model":"m","prompt":"x","n":2}`, param: "n"},
		{name: "ignore_eos string", kind: completions, body: `{"model":"m","prompt":"x","ignore_eos":"yes"}`, param: "ignore_eos"},
		{name: "min_tokens negative", kind: completions, body: `{"model":"m","prompt":"x","min_tokens":-1}`, param: "min_tokens"},
		{name: "min_tokens past max_tokens", kind: completions, body: `{"model":"m","prompt":"x","max_tokens":5,"min_tokens":6}`, param: "min_tokens"},
		{name: "min_tokens float", kind: completions, body: `{"model":"m","prompt":"x","min_tokens":1.5}`, param: "min_tokens"},
		{name: "min_tokens past int64", kind: completions, body: `{"model":"m","prompt":"x","min_tokens":1e30}`, param: "min_tokens"},
		{name: "duplicate min_tokens", kind: completions, body: `{"min_tokens":1,"model":"m","prompt":"x","min_tokens":900}`, param: "min_tokens"},
		{name: "duplicate ignore_eos", kind: completions, body: `{"ignore_eos":false,"model":"m","prompt":"x","ignore_eos":true}`, param: "ignore_eos"},
		{name: "duplicate best_of", kind: completions, body: `{"best_of":1,"model":"m","prompt":"x","best_of":9}`, param: "best_of"},
		{name: "duplicate stream", kind: completions, body: `{"stream":false,"model":"m","prompt":"x","stream":true}`, param: "stream"},
		{name: "duplicate messages", kind: chatCompletions, body: `{"model":"m","messages":[],"messages":[{"role":"user","content":"x"}]}`, param: "messages"},
		{name: "duplicate tools", kind: chatCompletions, body: `{"model":"m","tools":[],"tools":[{}],"messages":[{"role":"user","content":"x"}]}`, param: "tools"},
		{name: "duplicate role", kind: chatCompletions, body: `{"model":"m","messages":[{"role":"user","content":"x","role":"system"}]}`, param: "messages[0].role"},
		{name: "duplicate tool_calls", kind: chatCompletions, body: `{"model":"m","messages":[{"role":"assistant","tool_calls":[],"tool_calls":[{}]}]}`, param: "messages[0].tool_calls"},
		{name: "duplicate part text", kind: chatCompletions, body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","text":"bb"}]}]}`, param: "messages[0].content[0].text"},
		{name: "max_tokens past int64", kind: completions, body: `{"model":"m","prompt":"x","max_tokens":9223372036854775808}`, param: "max_tokens"},
		{name: "max_tokens huge float", kind: completions, body: `{"model":"m","prompt":"x","max_tokens":1e19}`, param: "max_tokens"},
		{name: "max_tokens NaN-like", kind: completions, body: `{"model":"m","prompt":"x","max_tokens":1e999}`, param: "max_tokens"},
		{name: "best_of fractional", kind: completions, body: `{"model":"m","prompt":"x","best_of":2.5}`, param: "best_of"},
	}
	var p fastjson.Parser
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRequest(&p, []byte(tt.body), tt.kind)
			if tt.param != "" {
				pe, ok := err.(*parseError)
				if !ok {
					t.Fatalf("err = %v, want a parse error on %s", err, tt.param)
				}
				if tt.param != "-" && pe.param != tt.param {
					t.Errorf("param %q, want %q (%s)", pe.param, tt.param, pe.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkPromptTexts(t, []byte(tt.body), got)
			if tt.want.seqs == 0 {
				tt.want.seqs = tt.want.n
			}
			got.kind, got.prompts = tt.want.kind, nil
			got.prefix = 0 // affinity keys have their own test
			// Compared by value, out of the arrays the request keeps them in.
			got.shapes = withoutPieces(got.shapes)
			got.oneShape, got.onePrompt = [1]promptShape{}, [1]promptText{}
			got.numText = [32]byte{} // scratch
			got.resumable = false    // TestResumable
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", *got, tt.want)
			}
		})
	}
}

func TestTokenizeBodies(t *testing.T) {
	var pp fastjson.ParserPool
	body := []byte(`{"model":"m\"x","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}`)
	p := pp.Get()
	r, err := parseRequest(p, body, chatCompletions)
	pp.Put(p)
	if err == nil {
		err = promptTexts(&pp, body, r)
	}
	if err != nil {
		t.Fatal(err)
	}
	var chat map[string]any
	if err := json.Unmarshal(tokenizeBody(nil, r, 0), &chat); err != nil {
		t.Fatal(err)
	}
	if chat["model"] != `m"x` || chat["add_generation_prompt"] != true || len(chat["messages"].([]any)) != 1 || chat["tools"] == nil {
		t.Errorf("chat tokenize body: %s", tokenizeBody(nil, r, 0))
	}
	for _, c := range []struct{ body, want string }{
		{`{"model":"m","prompt":["one", "two"]}`, `{"model":"m","prompt":"two"}`},
		{`{"model":"m","prompt":[[1,2],[3]]}`, ``},
		{`{"model":"m","pr\u006fmpt":["one","tw\u006f"]}`, `{"model":"m","prompt":"two"}`}, // read from the tree, quoted anew
	} {
		p := pp.Get()
		r, err := parseRequest(p, []byte(c.body), completions)
		pp.Put(p)
		if err == nil {
			err = promptTexts(&pp, []byte(c.body), r)
		}
		if err != nil || len(r.prompts) != 2 {
			t.Fatalf("%s: %d prompts, %v", c.body, len(r.prompts), err)
		}
		if got := string(r.prompts[1].text); c.want == "" && got != "" {
			t.Errorf("%s: a token-id prompt has text %s", c.body, got)
		} else if c.want != "" && string(tokenizeBody(nil, r, 1)) != c.want {
			t.Errorf("%s: batch tokenize body %s, want %s", c.body, tokenizeBody(nil, r, 1), c.want)
		}
	}
}

// checkPromptTexts checks the prompts found in body (already parsed into
// r) by scanning it: one per prompt, none for token ids, and each one's
// /tokenize body the JSON a parse tree of body gives.
func checkPromptTexts(t *testing.T, body []byte, r *request) {
	t.Helper()
	var pp fastjson.ParserPool
	if err := promptTexts(&pp, body, r); err != nil {
		t.Fatalf("promptTexts after a good parse: %v", err)
	}
	if len(r.prompts) != len(r.shapes) {
		t.Fatalf("%d prompts for %d shapes in %q", len(r.prompts), len(r.shapes), body)
	}
	if !json.Valid(body) {
		// fastjson takes what strict parsers refuse (a raw control
		// character in a string); the backend refuses the request itself.
		return
	}
	tree := *r
	var p fastjson.Parser
	if err := tree.promptTextsFromTree(&p, body); err != nil {
		t.Fatal(err)
	}
	for i, sh := range r.shapes {
		if sh.ids {
			if r.prompts[i].text != nil {
				t.Fatalf("prompt %d of %q is token ids, yet has text %q", i, body, r.prompts[i].text)
			}
			continue
		}
		var got, want any
		if err := json.Unmarshal(tokenizeBody(nil, r, i), &got); err != nil {
			t.Fatalf("tokenize body %d of %q: %v: %s", i, body, err, tokenizeBody(nil, r, i))
		}
		if err := json.Unmarshal(tokenizeBody(nil, &tree, i), &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("tokenize body %d of %q: %s, from a tree %s", i, body, tokenizeBody(nil, r, i), tokenizeBody(nil, &tree, i))
		}
	}
}

// FuzzParseRequest: any body either parses into a request whose fields are
// sane, or is a 400 naming what is wrong; it never panics.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":5,"n":2,"stream":true}`,
		`{"model":"m","prompt":["a","b"],"best_of":3}`,
		`{"model":"m","prompt":[[1,2],[3]]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url"}]}],"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":null}`, `[]`, `{`, `""`,
		"{\"model\":\"\x00\",\"prompt\":[\"\"]}", `{"model":"\u0000\u007f\ud800","prompt":"\u0001"}`,
		`{"model":"m","prompt":"a","stream":true,"\u0007":1,"max\u005ftokens":null}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	var p fastjson.Parser
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		kind := completions
		if chat {
			kind = chatCompletions
		}
		r, err := parseRequest(&p, body, kind)
		if err != nil {
			pe, ok := err.(*parseError)
			if !ok || err.Error() == "" {
				t.Fatalf("error of type %T: %v", err, err)
			}
			e := &apiError{status: 400, typ: typeInvalidRequest, param: pe.param, message: pe.msg}
			if out := e.appendJSON(nil, true); !json.Valid(out) {
				t.Fatalf("error body not JSON: %q from %q", out, body)
			}
			return
		}
		if e := (&apiError{message: "The model `" + r.model + "` does not exist.", code: r.model}); !json.Valid(e.appendJSON(nil, false)) {
			t.Fatalf("error event naming model %q not JSON", r.model)
		}
		if r.model == "" || r.n < 1 || r.n > 128 || r.seqs < r.n || r.maxTokens < 0 || len(r.shapes) == 0 {
			t.Fatalf("insane request %+v from %q", r, body)
		}
		checkPromptTexts(t, body, r)
		if r.stream {
			out, err := rewriteBody(body, askContinuous, 7, r.dropMaxCompletion, "")
			if err != nil || !json.Valid(out) || !strings.Contains(string(out), `"include_usage":true`) || !strings.Contains(string(out), `"max_tokens":7`) {
				t.Fatalf("rewriteBody(%q) = %q, %v", body, out, err)
			}
		}
	})
}

func BenchmarkParseRequest(b *testing.B) {
	body := []byte(`{"model":"llama-3-8b","stream":true,"max_tokens":256,"temperature":0.7,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"` + strings.Repeat("Tell me about KV caches. ", 40) + `"}]}`)
	var p fastjson.Parser
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseRequest(&p, body, chatCompletions); err != nil {
			b.Fatal(err)
		}
	}
}

func TestParseRefusesWhatJSONForbidsInStrings(t *testing.T) {
	var p fastjson.Parser
	_, err := parseRequest(&p, []byte("{\"model\":\"m\",\"prompt\":\"a\x00b\"}"), completions)
	if err == nil || !strings.Contains(err.Error(), "U+0000") || !strings.Contains(err.Error(), "offset 24") {
		t.Errorf("raw NUL in a prompt: %v; want a 400 naming U+0000 at offset 24", err)
	}
	if _, err := parseRequest(&p, []byte(`{"model":"m","prompt":"a","\0":1}`), completions); err == nil || !strings.Contains(err.Error(), "invalid escape") {
		t.Errorf(`key "\0": %v; want a 400 naming the invalid escape`, err)
	}
	// The same character escaped is JSON, and the /tokenize body carries it
	// escaped, whether the prompt is found by its bytes or (a key written
	// with escapes) from a parse tree.
	for _, body := range []string{`{"model":"m\u0000","prompt":"a\u0000b"}`, `{"model":"m\u0000","pro\u006dpt":"a\u0000b"}`} {
		r, err := parseRequest(&p, []byte(body), completions)
		if err == nil {
			var pp fastjson.ParserPool
			err = promptTexts(&pp, []byte(body), r)
		}
		if err != nil {
			t.Errorf("escaped NUL in %s: %v", body, err)
			continue
		}
		if got := tokenizeBody(nil, r, 0); string(got) != `{"model":"m\u0000","prompt":"a\u0000b"}` {
			t.Errorf("escaped NUL in %s: /tokenize body %s", body, got)
		}
	}
}

// fastjson reads any run of digits, signs, dots and exponent letters as a
// number (and inf and nan); the gateway refuses what JSON does not, where
// it sits in the body, as the backend's own parser would.
func TestParseRefusesWhatJSONForbidsInNumbers(t *testing.T) {
	var p fastjson.Parser
	for _, tt := range []struct {
		body, bad string // bad: the number the 400 names; "" = the body is good
	}{
		{`{"model":"m","prompt":"a","max_tokens":16,"temperature":0.7,"x":-1.5e+3,"y":0,"z":-0,"w":1E2}`, ""},
		{`{"model":"m","prompt":[[1,2,3]]}`, ""},
		{`{"model":"m","prompt":"a","x":00}`, "00"},
		{`{"model":"m","prompt":"a","x":01}`, "01"},
		{`{"model":"m","prompt":"a","x":+1}`, "+1"},
		{`{"model":"m","prompt":"a","x":.5}`, ".5"},
		{`{"model":"m","prompt":"a","x":1.}`, "1."},
		{`{"model":"m","prompt":"a","x":1e}`, "1e"},
		{`{"model":"m","prompt":"a","x":1e+}`, "1e+"},
		{`{"model":"m","prompt":"a","x":1-2}`, "1-2"},
		{`{"model":"m","prompt":"a","x":nan}`, "nan"},
		{`{"model":"m","prompt":"a","x":-Inf}`, "-Inf"},
		{`{"model":"m","prompt":"a","x":{"y":[true,null,{"z":[0,00]}]}}`, "00"},
		{`{"model":"m","prompt":[[1,2,03]]}`, "03"},
		{`{"model":"m","prompt":"a","x":1.2.3}`, "1.2.3"},
		{`{"model":"m","prompt":"a","x":` + strings.Repeat("0", 40) + `}`, strings.Repeat("0", 24) + "…"},
	} {
		_, err := parseRequest(&p, []byte(tt.body), completions)
		switch {
		case tt.bad == "" && err != nil:
			t.Errorf("%s: %v", tt.body, err)
		case tt.bad != "" && (err == nil || !strings.Contains(err.Error(), strconv.Quote(tt.bad)+" is not a JSON number")):
			t.Errorf("%s: %v; want a 400 naming %q", tt.body, err, tt.bad)
		}
	}
}

// withoutPieces is a copy of shapes with the counts that textPieces and
// addJSON's layout give set to zero: TestTextPieces checks those.
func withoutPieces(shapes []promptShape) []promptShape {
	out := append([]promptShape(nil), shapes...)
	for i := range out {
		out[i].pieces, out[i].layout = 0, 0
	}
	return out
}
