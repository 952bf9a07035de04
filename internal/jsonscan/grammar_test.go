package jsonscan

import (
	"strings"
	"testing"
)

func TestInvalidString(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int
	}{
		{`{"a":"b"}`, -1},
		{"{\n\t\"a\" :\r\n \"b\"\n}", -1}, // whitespace between tokens is JSON
		{"{\"a\":\"b\nc\"}", 7},
		{"{\"a\":\"\\\"\x00\"}", 8}, // after an escaped quote, still inside
		{"{\"a\":\"\\\\\"\n}", -1},  // an escaped backslash ends the string
		{"{\"k\x1f\":1}", 3},
		{strings.Repeat(" ", 13) + "\"\x01\"", 14},
		{`{"a":"\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00"}`, -1},
		{`{"\0":1}`, 2},
		{`{"a":"x\u12G4"}`, 7},
		{`{"a":"x\u12"}`, 7},
		{`{"a":"x\`, 7},
	} {
		if got, what := InvalidString([]byte(tt.in)); got != tt.want || (got >= 0) != (what != "") {
			t.Errorf("InvalidString(%q) = %d, %q; want %d", tt.in, got, what, tt.want)
		}
	}
}

// hasControl against the plain byte loop: every byte value at every
// position of buffers up to past two of its 32-byte blocks, on backgrounds
// that make borrows (bytes just above 0x20, the high bit set, 0x80 and
// 0xff beside each other).
func TestHasControl(t *testing.T) {
	plain := func(b []byte) bool {
		for _, c := range b {
			if c < 0x20 {
				return true
			}
		}
		return false
	}
	for _, bg := range []string{"a", " ", "!", "\x7f", "\x80", "\xff", " \x80!\xff\x7f~"} {
		for n := 0; n <= 72; n++ {
			buf := []byte(strings.Repeat(bg, n+1)[:n])
			if hasControl(buf) != plain(buf) {
				t.Fatalf("hasControl(%q) = %v", buf, !plain(buf))
			}
			for at := 0; at < n; at++ {
				keep := buf[at]
				for c := 0; c < 256; c++ {
					buf[at] = byte(c)
					if got, want := hasControl(buf), plain(buf); got != want {
						t.Fatalf("hasControl(%q) = %v, want %v", buf, got, want)
					}
				}
				buf[at] = keep
			}
		}
	}
}
