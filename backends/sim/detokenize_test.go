package sim

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDetokenize: the ids /tokenize answers decode back to the text, for
// prompts and chats alike; generated text decodes without being tokenized
// first; and what cannot be decoded is refused in vLLM's shape.
func TestDetokenize(t *testing.T) {
	s, base := startServer(t, Config{MaxModelLen: 4096})
	tokenize := func(t *testing.T, body string) []int {
		t.Helper()
		code, b := post(t, base+"/tokenize", body)
		if code != 200 {
			t.Fatalf("/tokenize: %d %s", code, b)
		}
		var r struct{ Tokens []int }
		unmarshal(t, b, &r)
		return r.Tokens
	}
	detokenize := func(t *testing.T, ids []int) string {
		t.Helper()
		tb, _ := json.Marshal(ids)
		code, b := post(t, base+"/detokenize", `{"model":"llama-3-8b","tokens":`+string(tb)+`}`)
		if code != 200 {
			t.Fatalf("/detokenize: %d %s", code, b)
		}
		var r struct{ Prompt *string }
		unmarshal(t, b, &r)
		if r.Prompt == nil {
			t.Fatalf("/detokenize answered no prompt: %s", b)
		}
		return *r.Prompt
	}
	tests := []struct{ name, body, want string }{
		{"plain", `{"prompt":"Hello, world! 12345\n\n  tabs\tand ünïcödé 🙂 end","add_special_tokens":false}`,
			"Hello, world! 12345\n\n  tabs\tand ünïcödé 🙂 end"},
		{"with BOS", `{"prompt":"Once upon a time"}`, "<|begin_of_text|>Once upon a time"},
		{"chat", `{"messages":[{"role":"user","content":"Hi there"}]}`,
			"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"empty", `{"prompt":"","add_special_tokens":false}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := detokenize(t, tokenize(t, tc.body)); got != tc.want {
				t.Errorf("round trip = %q, want %q", got, tc.want)
			}
		})
	}

	t.Run("generated text", func(t *testing.T) {
		text, _ := completionText(t, base, `{"model":"llama-3-8b","prompt":"zq","max_tokens":12}`)
		// Its ids, as the tokenizer gives them, without teaching the vocab.
		var ids []int
		for b := []byte(text); len(b) > 0; {
			n := nextPiece(b)
			ids = append(ids, pieceID(b[:n]))
			b = b[n:]
		}
		if got := detokenize(t, ids); got != text {
			t.Errorf("generated %q decodes to %q", text, got)
		}
	})

	bad := []struct{ name, body, want string }{
		{"unseen id", `{"tokens":[` + unseenID(t, s.vocab) + `]}`, "not one the simulator has produced"},
		{"out of vocabulary", `{"tokens":[128256]}`, "out of vocabulary"},
		{"negative", `{"tokens":[-1]}`, "out of vocabulary"},
		{"not integers", `{"tokens":["a"]}`, "valid integer"},
		{"missing tokens", `{"model":"llama-3-8b"}`, "tokens: Field required"},
		{"malformed", `{"tokens":`, "JSON decode error"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			code, b := post(t, base+"/detokenize", tc.body)
			if msg := checkErrorBody(t, code, b, 400, "BadRequestError"); !strings.Contains(msg, tc.want) {
				t.Errorf("message %q lacks %q", msg, tc.want)
			}
		})
	}
	code, b := post(t, base+"/detokenize", `{"model":"x","tokens":[]}`)
	checkErrorBody(t, code, b, 404, "NotFoundError")
}

// unseenID is an ordinary id that no piece v knows has.
func unseenID(t *testing.T, v *vocab) string {
	for id := 1; id < plainVocab; id++ {
		if _, _, ok := v.decode([]int{id}); !ok {
			b, _ := json.Marshal(id)
			return string(b)
		}
	}
	t.Fatal("every id known")
	return ""
}
