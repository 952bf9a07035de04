package sim

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// Text dense in tokens costs more tokens a byte than English, as it does
// in real vocabularies: a gateway that counted every text at English's
// rate would under-count it. And no text, whatever it is, takes more
// tokens than bytes.
func TestDenseTextCostsMoreTokensPerByte(t *testing.T) {
	perByte := func(text string) float64 { return float64(countTokens([]byte(text))) / float64(len(text)) }
	english := perByte(strings.Repeat("The quick brown fox jumps over the lazy dog while engineers measure throughput. ", 20))
	for name, text := range map[string]string{
		"code":   strings.Repeat("func (s *Server) route(ctx *fasthttp.RequestCtx) { if x[i] != nil { return } }\n", 20),
		"json":   strings.Repeat(`{"id":12345,"price":[19.99,4.5],"ok":true},`, 20),
		"digits": strings.Repeat("3.14159265358979 2.71828182845904 ", 20),
		"cjk":    strings.Repeat("日本語のテキストは英語より多くのトークンを使います。", 20),
		"emoji":  strings.Repeat("🎉🚀😀👍🔥 ", 20),
	} {
		if d := perByte(text); d <= english*1.3 {
			t.Errorf("%s: %.3f tokens a byte, not denser than English's %.3f", name, d, english)
		}
	}
	r := rand.New(rand.NewPCG(7, 8))
	for range 2000 {
		b := make([]byte, 0, 64)
		for range r.IntN(40) {
			b = utf8.AppendRune(b, randomRune(r))
		}
		if n := countTokens(b); n > len(b) {
			t.Fatalf("%q: %d tokens for %d bytes", b, n, len(b))
		}
	}
}

// randomRune draws from ASCII, two-, three- and four-byte runes alike.
func randomRune(r *rand.Rand) rune {
	switch r.IntN(4) {
	case 0:
		return rune(r.IntN(0x80))
	case 1:
		return rune(0x80 + r.IntN(0x800-0x80))
	case 2:
		return rune(0x4E00 + r.IntN(0x9FFF-0x4E00))
	}
	return rune(0x1F300 + r.IntN(0x1FAFF-0x1F300))
}

// Tools are part of the prompt: /tokenize counts them as the chat request
// renders them, and a Messages or Responses request with tools is the chat
// request with its tools converted, counted the same.
func TestToolsAreCounted(t *testing.T) {
	_, base := startServer(t, Config{Seed: 1})
	count := func(body string) int {
		t.Helper()
		status, b := post(t, base+"/tokenize", body)
		var tk struct{ Count int }
		if err := json.Unmarshal(b, &tk); status != 200 || err != nil {
			t.Fatalf("%d %s", status, b)
		}
		return tk.Count
	}
	const msgs = `"messages":[{"role":"user","content":"weather in Paris?"}]`
	chatTools := `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	plain, withTools := count(`{`+msgs+`}`), count(`{`+msgs+`,"tools":`+chatTools+`}`)
	if withTools <= plain+len("get_weather")/4 {
		t.Fatalf("tools did not count: %d with, %d without", withTools, plain)
	}
	usage := func(path, body string) int {
		t.Helper()
		status, b := post(t, base+path, body)
		var a struct {
			Usage struct {
				InputTokens  int `json:"input_tokens"`
				PromptTokens int `json:"prompt_tokens"`
			}
		}
		if err := json.Unmarshal(b, &a); status != 200 || err != nil {
			t.Fatalf("%s: %d %s", path, status, b)
		}
		return a.Usage.InputTokens + a.Usage.PromptTokens
	}
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"llama-3-8b","max_tokens":1,` + msgs + `,"tools":` + chatTools + `}`},
		{"/v1/messages", `{"model":"llama-3-8b","max_tokens":1,` + msgs + `,"tools":[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]}`},
		{"/v1/responses", `{"model":"llama-3-8b","max_output_tokens":1,"input":[{"role":"user","content":"weather in Paris?"}],"tools":[{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]}`},
	} {
		if got := usage(tc.path, tc.body); got != withTools {
			t.Errorf("%s: %d prompt tokens, /tokenize of the chat request says %d", tc.path, got, withTools)
		}
	}
	if status, _ := post(t, base+"/v1/messages", `{"model":"llama-3-8b","max_tokens":1,`+msgs+`,"tools":[{"type":"web_search_20250305","name":"web_search"}]}`); status != 400 {
		t.Errorf("a server tool: %d, want 400", status)
	}
}

func TestNoTokenize(t *testing.T) {
	_, base := startServer(t, Config{Seed: 1, NoTokenize: true})
	if status, b := post(t, base+"/tokenize", `{"prompt":"hi"}`); status != 404 {
		t.Fatalf("/tokenize: %d %s, want 404", status, b)
	}
	if status, b := post(t, base+"/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":1}`); status != 200 {
		t.Fatalf("completions: %d %s", status, b)
	}
}
