package sim

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func pieces(text string) []string {
	var out []string
	b := []byte(text)
	for len(b) > 0 {
		n := nextPiece(b)
		out = append(out, string(b[:n]))
		b = b[n:]
	}
	return out
}

func TestTokenizerPieces(t *testing.T) {
	tests := []struct {
		text string
		want []string
	}{
		{"", nil},
		{"a", []string{"a"}},
		{"Hello world", []string{"Hell", "o", " wor", "ld"}},
		{"the cat sat.", []string{"the", " cat", " sat", "."}},
		{"x  y", []string{"x", " ", " y"}},
		{"a     b", []string{"a", "    ", " b"}},
		{"1234567", []string{"123", "456", "7"}},
		{"v2", []string{"v", "2"}},
		{"line\n\nnext\r\n", []string{"line", "\n\n", "next", "\r\n"}},
		{"don't", []string{"don", "'", "t"}},
		{"naïve", []string{"naï", "ve"}},                                     // ï is 2 bytes: never split
		{" 日本語", []string{" ", "\xe6\x97", "\xa5", "本", "\xe8\xaa", "\x9e"}}, // 3-byte runes: one token or two
		{" 😀x", []string{" ", "\xf0\x9f\x98", "\x80", "x"}},                  // a 4-byte rune: two tokens or three
		{"a\n    b", []string{"a", "\n   ", " b"}},                           // a line break takes its indent
		{"tab\there", []string{"tab", "\t", "here"}},                         // a tab is not a word's space
	}
	for _, tc := range tests {
		got := pieces(tc.text)
		if strings.Join(got, "|") != strings.Join(tc.want, "|") || len(got) != len(tc.want) {
			t.Errorf("pieces(%q) = %q, want %q", tc.text, got, tc.want)
		}
		if countTokens([]byte(tc.text)) != len(tc.want) {
			t.Errorf("countTokens(%q) = %d, want %d", tc.text, countTokens([]byte(tc.text)), len(tc.want))
		}
		for _, p := range got {
			if !utf8.ValidString(p) && p[0] < 0xE0 && (p[0] < 0x80 || p[0] >= 0xC0) {
				t.Errorf("pieces(%q) split a rune: %q", tc.text, p)
			}
		}
	}
}

func TestTokenizerEnglishRate(t *testing.T) {
	text := "The KV cache of a transformer holds the keys and values of every token it has seen, so that each new token attends to them without recomputing."
	n := countTokens([]byte(text))
	if rate := float64(len(text)) / float64(n); rate < 3 || rate > 5 {
		t.Errorf("%.1f bytes a token on English, want about 4 (a BPE's rate)", rate)
	}
}

func TestTokenIDs(t *testing.T) {
	p := newPrompt(true, false)
	p.text([]byte("same same"))
	q := newPrompt(true, false)
	q.text([]byte("same same"))
	if len(p.ids) != 3 || p.ids[1] != q.ids[1] || p.ids[0] == p.ids[1] {
		t.Fatalf("ids %v / %v: want deterministic, per-piece ids", p.ids, q.ids)
	}
	for _, id := range p.ids {
		if id < 0 || id >= plainVocab {
			t.Fatalf("ordinary id %d outside [0, %d)", id, plainVocab)
		}
	}
	// Counting without collecting agrees, and the content hash changes with
	// where text is cut between messages.
	c := newPrompt(false, false)
	c.text([]byte("same same"))
	if c.tokens != p.tokens || c.hash != p.hash {
		t.Fatal("counting and collecting disagree")
	}
	a, b := newPrompt(false, false), newPrompt(false, false)
	a.text([]byte("ab"))
	a.text([]byte("c"))
	b.text([]byte("a"))
	b.text([]byte("bc"))
	if a.hash == b.hash {
		t.Fatal("(ab, c) and (a, bc) hash alike")
	}
}

func TestChatTemplateCount(t *testing.T) {
	p := newPrompt(true, true)
	p.chatBegin()
	p.chatHeader([]byte("user"))
	p.text([]byte("Hi"))
	p.chatEnd()
	p.chatGenerationPrompt()
	want := []string{"<|begin_of_text|>", "<|start_header_id|>", "user", "<|end_header_id|>", "\n\n", "Hi", "<|eot_id|>",
		"<|start_header_id|>", "assi", "stan", "t", "<|end_header_id|>", "\n\n"}
	if strings.Join(p.strs, "|") != strings.Join(want, "|") || p.tokens != len(want) {
		t.Fatalf("chat template = %q, want %q", p.strs, want)
	}
	if p.ids[0] != tokBOS || p.ids[1] != tokStartHdr || p.ids[3] != tokEndHdr || p.ids[6] != tokEOT {
		t.Fatalf("special ids %v", p.ids[:7])
	}
}

func TestOutputPiecesAreOneToken(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range outputPieces {
		if countTokens([]byte(p)) != 1 || seen[p] {
			t.Errorf("output piece %q is %d tokens (or repeated)", p, countTokens([]byte(p)))
		}
		seen[p] = true
		if strings.ContainsAny(p, "\"\\\n") {
			t.Errorf("output piece %q needs JSON escaping", p)
		}
	}
	// A generated text re-tokenizes to its length, whatever the key.
	for k := range uint64(50) {
		text := appendText(nil, mix(k), 0, 200)
		if n := countTokens(text); n != 200 {
			t.Fatalf("200 generated tokens re-tokenize to %d: %q", n, text)
		}
	}
}

func BenchmarkCountTokens(b *testing.B) {
	text := []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 100))
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		countTokens(text)
	}
}
