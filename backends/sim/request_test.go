package sim

import (
	"net/http"
	"testing"

	"github.com/valyala/fastjson"
)

func parse(t testing.TB, s *settings, chat bool, body string) (genParams, *apiError) {
	t.Helper()
	var p fastjson.Parser
	return parseGenRequest(&p, []byte(body), chat, s)
}

func TestParseGenRequest(t *testing.T) {
	c := poolConfig(200)
	c.MaxModelLen = 1024
	s := testSettings(t, c)
	tests := []struct {
		name   string
		chat   bool
		body   string
		prompt int
		max    int
		n      int
		stream bool
		usage  bool
	}{
		{"defaults: max_tokens fills the context", false, `{"model":"llama-3-8b","prompt":"hi"}`, 2, 1022, 1, false, false},
		{"token ids carry no BOS", false, `{"model":"llama-3-8b","prompt":[5,6,7],"max_tokens":3}`, 3, 3, 1, false, false},
		{"one list of ids", false, `{"model":"llama-3-8b","prompt":[[5,6]],"max_tokens":3}`, 2, 3, 1, false, false},
		{"one string in a list", false, `{"model":"llama-3-8b","prompt":["hi"],"max_tokens":3}`, 2, 3, 1, false, false},
		{"no special tokens", false, `{"model":"llama-3-8b","prompt":"hi","add_special_tokens":false,"max_tokens":3}`, 1, 3, 1, false, false},
		{"a whole float is an int", false, `{"model":"llama-3-8b","prompt":"hi","max_tokens":16.0,"n":2.0}`, 2, 16, 2, false, false},
		{"nulls are absent", false, `{"model":"llama-3-8b","prompt":"hi","max_tokens":null,"n":null,"stream":null,"stream_options":null}`, 2, 1022, 1, false, false},
		{"include_usage defaults to true", false, `{"model":"llama-3-8b","prompt":"hi","stream":true,"stream_options":{}}`, 2, 1022, 1, true, true},
		{"include_usage false", false, `{"model":"llama-3-8b","prompt":"hi","stream":true,"stream_options":{"include_usage":false}}`, 2, 1022, 1, true, false},
		{"unknown fields are ignored", false, `{"model":"llama-3-8b","prompt":"hi","temperature":0.7,"stop":["\n"],"logprobs":3,"max_tokens":5}`, 2, 5, 1, false, false},
		// BOS, header(user)=4, "hi", eot, assistant header=6.
		{"chat template", true, `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`, 13, 4, 1, false, false},
		{"max_completion_tokens wins", true, `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"max_completion_tokens":9}`, 13, 9, 1, false, false},
		{"no generation prompt", true, `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false,"max_tokens":4}`, 7, 4, 1, false, false},
		// The assistant's message left open: its header and "hi", no eot.
		{"continue the final message", true, `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hi"}],"add_generation_prompt":false,"continue_final_message":true,"max_tokens":4}`, 14, 4, 1, false, false},
		{"null content", true, `{"model":"llama-3-8b","messages":[{"role":"assistant","content":null}],"max_tokens":1}`, 14, 1, 1, false, false},
	}
	for _, tc := range tests {
		g, err := parse(t, s, tc.chat, tc.body)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if g.promptTokens != tc.prompt || g.maxTokens != tc.max || g.n != tc.n || g.stream != tc.stream || g.includeUsage != tc.usage {
			t.Errorf("%s: got prompt %d max %d n %d stream %t usage %t", tc.name, g.promptTokens, g.maxTokens, g.n, g.stream, g.includeUsage)
		}
	}
	// As vLLM: a message cannot be both continued and followed by a new one.
	if _, err := parse(t, s, true, `{"model":"llama-3-8b","messages":[{"role":"assistant","content":"hi"}],"continue_final_message":true}`); err == nil || err.param != "continue_final_message" {
		t.Errorf("continue_final_message with add_generation_prompt: %v, want a 400 naming continue_final_message", err)
	}
}

func TestRequestKey(t *testing.T) {
	s := testSettings(t, poolConfig(200))
	key := func(body string) uint64 {
		g, err := parse(t, s, false, body)
		if err != nil {
			t.Fatal(err)
		}
		return g.key
	}
	base := key(`{"model":"llama-3-8b","prompt":"hello","max_tokens":8}`)
	if key(`{"model":"llama-3-8b","prompt":"hello","max_tokens":8,"stream":true}`) != base {
		t.Error("streaming changes the output")
	}
	if key(`{"max_tokens":8,"prompt":"hello","model":"llama-3-8b","temperature":1}`) != base {
		t.Error("field order or ignored fields change the output")
	}
	for _, other := range []string{
		`{"model":"llama-3-8b","prompt":"hellp","max_tokens":8}`,
		`{"model":"llama-3-8b","prompt":"hello","max_tokens":9}`,
		`{"model":"llama-3-8b","prompt":"hello","max_tokens":8,"n":2}`,
		`{"model":"llama-3-8b","prompt":"hello","max_tokens":8,"seed":1}`,
	} {
		if key(other) == base {
			t.Errorf("%s has the same output as the base request", other)
		}
	}
	g1, _ := parse(t, s, true, `{"model":"llama-3-8b","messages":[{"role":"user","content":"ab"},{"role":"user","content":"c"}]}`)
	g2, _ := parse(t, s, true, `{"model":"llama-3-8b","messages":[{"role":"user","content":"a"},{"role":"user","content":"bc"}]}`)
	if g1.key == g2.key {
		t.Error("messages cut differently share an output")
	}
	s2 := testSettings(t, Config{Seed: 1})
	g3, _ := parse(t, s2, false, `{"model":"llama-3-8b","prompt":"hello","max_tokens":8}`)
	if g3.key == base {
		t.Error("the seed does not change the output")
	}
}

// FuzzParseGenRequest: any body is either a valid request within the
// server's limits or a 400/404 with a message, and never a panic.
func FuzzParseGenRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"llama-3-8b","prompt":"hi","max_tokens":5}`,
		`{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3,"n":2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"llama-3-8b","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
		`{"model":"llama-3-8b","prompt":[[1,2,3]],"min_tokens":2,"max_tokens":4,"ignore_eos":true}`,
		`{"model":"llama-3-8b","prompt":[1e400]}`,
		`{"model":"x"}`, `[]`, `null`, `{"prompt":"` + "\xff\xfe" + `"}`, `{"model":"llama-3-8b","prompt":"a","max_tokens":-9223372036854775808}`,
	} {
		f.Add(seed)
	}
	c := poolConfig(200)
	c.MaxModelLen = 512
	s, err := c.resolve()
	if err != nil {
		f.Fatal(err)
	}
	var p fastjson.Parser
	f.Fuzz(func(t *testing.T, body string) {
		for _, chat := range []bool{false, true} {
			g, aerr := parseGenRequest(&p, []byte(body), chat, s)
			if aerr != nil {
				if (aerr.status != http.StatusBadRequest && aerr.status != http.StatusNotFound) || aerr.msg == "" || aerr.typ == "" {
					t.Fatalf("bad error %+v for %q", aerr, body)
				}
				if b := aerr.appendJSON(nil); !fastjson.Exists(b, "error", "message") {
					t.Fatalf("error body %s is not vLLM's shape", b)
				}
				continue
			}
			if g.promptTokens < 1 || g.maxTokens < 1 || g.promptTokens+g.maxTokens > s.maxModelLen || g.n < 1 || g.n > s.maxNumSeqs ||
				g.minTokens < 0 || g.minTokens > g.maxTokens || (g.includeUsage && !g.stream) {
				t.Fatalf("accepted out of limits: %+v for %q", g, body)
			}
			if peak := s.layout.RequestBlocks(g.promptTokens, g.maxTokens, g.n); peak > s.numBlocks-s.watermark {
				t.Fatalf("accepted a request of %d blocks on a pool of %d: %q", peak, s.numBlocks, body)
			}
		}
	})
}

func BenchmarkParseChatRequest(b *testing.B) {
	s := testSettings(b, Config{})
	body := []byte(`{"model":"llama-3-8b","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a short story about a robot learning to paint, in about three hundred words."}],"max_tokens":256,"stream":true,"stream_options":{"include_usage":true},"temperature":0.7}`)
	var p fastjson.Parser
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseGenRequest(&p, body, true, s); err != nil {
			b.Fatal(err)
		}
	}
}
