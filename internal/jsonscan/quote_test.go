package jsonscan

import (
	"encoding/json"
	"testing"
)

func TestAppendString(t *testing.T) {
	for _, in := range []string{
		"", "plain", `q"uote\back`, "\x00\x01\a\b\f\n\r\t\v\x1f", "\x7f del", "é ✓ 𝄞 \U000e0001",
		"bad \xff\xfe utf-8", "\u2028\u2029", "\xed\xa0\x80 surrogate",
	} {
		out := AppendString([]byte("x"), in)
		if out[0] != 'x' {
			t.Fatalf("AppendString overwrote dst: %q", out)
		}
		var back string
		if err := json.Unmarshal(out[1:], &back); err != nil {
			t.Errorf("AppendString(%q) = %s: not JSON: %v", in, out[1:], err)
			continue
		}
		want, _ := json.Marshal(in) // encoding/json's reading of the same string
		var wantBack string
		_ = json.Unmarshal(want, &wantBack)
		if back != wantBack {
			t.Errorf("AppendString(%q) reads back as %q; want %q", in, back, wantBack)
		}
	}
}
