package jsonscan

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/valyala/fastjson"
)

// Duplicate is the first of keys that appears more than once in the object
// v ("" if none, or if v is not an object). Parsers disagree on which
// occurrence of a repeated key counts (Go's keep the first, Python's the
// last), so a reader whose document another parser will read again refuses
// a repeated key it acts on. At most 64 keys are told apart.
func Duplicate(v *fastjson.Value, keys []string) string {
	o, err := v.Object()
	if err != nil {
		return ""
	}
	var seen uint64 // bit i: keys[i] met
	var dup string
	o.Visit(func(k []byte, _ *fastjson.Value) {
		if dup != "" {
			return
		}
		for i, want := range keys {
			if string(k) == want {
				if seen&(1<<i) != 0 {
					dup = want
				}
				seen |= 1 << i
				return
			}
		}
	})
	return dup
}

// InvalidString returns the offset of the first byte inside a string of
// the JSON text body that JSON forbids there — a control character (below
// U+0020) written raw, or a backslash that starts no valid escape — with
// what is wrong, or -1. Python's json refuses both; fastjson lets them
// through, and a string copied from the body into another document would
// carry them into invalid JSON.
//
// body must have been parsed by fastjson already, so every backslash in it is inside a
// string, and so is every control character but JSON's whitespace: the
// escapes are checked by jumping from backslash to backslash, and only a
// body with a tab, newline or carriage return (pretty-printed JSON) is
// walked string by string.
func InvalidString(body []byte) (int, string) {
	for j := 0; ; {
		k := bytes.IndexByte(body[j:], '\\')
		if k < 0 {
			break
		}
		i := j + k
		n := escapeLen(body[i+1:])
		if n == 0 {
			return i, "invalid escape sequence in a string"
		}
		j = i + 1 + n
	}
	if !hasControl(body) {
		return -1, ""
	}
	in := false
	for i := 0; i < len(body); i++ {
		switch c := body[i]; {
		case c == '"':
			in = !in
		case !in:
		case c < 0x20:
			return i, fmt.Sprintf("control character U+%04X inside a string (write it as \\u%04x)", c, c)
		case c == '\\':
			i++
		}
	}
	return -1, ""
}

// InvalidNumber returns the text of the first number in v that JSON's
// grammar refuses, or "". fastjson takes any run of digits, signs, dots and
// exponents for a number, and inf and nan too: 00, 1-2, +1, .5 or nan
// parse, where Python's json refuses them. The walk is over the parse tree, not the
// body: a long prompt is one string, which costs nothing here. Overlong
// text is cut for the message. scratch holds each number's text in turn.
func InvalidNumber(v *fastjson.Value, scratch []byte) string {
	switch v.Type() {
	case fastjson.TypeNumber:
		if raw := v.MarshalTo(scratch[:0]); !isNumber(raw) {
			if len(raw) > 24 {
				return string(raw[:24]) + "…"
			}
			return string(raw)
		}
	case fastjson.TypeArray:
		a, _ := v.Array()
		for _, e := range a {
			if bad := InvalidNumber(e, scratch); bad != "" {
				return bad
			}
		}
	case fastjson.TypeObject:
		o, _ := v.Object()
		var bad string
		o.Visit(func(_ []byte, e *fastjson.Value) {
			if bad == "" {
				bad = InvalidNumber(e, scratch)
			}
		})
		return bad
	}
	return ""
}

// isNumber reports whether b is a number by JSON's grammar:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func isNumber(b []byte) bool {
	i := 0
	digits := func() int {
		n := 0
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch n := digits(); {
	case n == 0:
		return false
	case n > 1 && b[i-n] == '0':
		return false // a leading zero
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

// escapeLen is the length of the escape that esc, what follows a
// backslash, starts (1, or 5 for \uXXXX), or 0 if it is none of JSON's.
func escapeLen(esc []byte) int {
	if len(esc) == 0 {
		return 0
	}
	switch esc[0] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 1
	case 'u':
		if len(esc) < 5 {
			return 0
		}
		for _, h := range esc[1:5] {
			if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
				return 0
			}
		}
		return 5
	}
	return 0
}

// hasControl reports whether b holds any byte below 0x20, 32 bytes at a
// time: most bodies (compact JSON from the SDKs) have none and pay only
// this, which on a 4k-token prompt is most of the cost of checking its
// strings. A word's bytes below 0x20 are those whose high bit
// (x - 0x20…) &^ x sets (a borrow can only spread from a byte that is
// below 0x20 itself); four words are tested at once, so that their
// arithmetic overlaps.
func hasControl(b []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	const lo = ones * 0x20
	i := 0
	for ; i+32 <= len(b); i += 32 {
		w := b[i : i+32 : i+32]
		x0 := binary.LittleEndian.Uint64(w)
		x1 := binary.LittleEndian.Uint64(w[8:])
		x2 := binary.LittleEndian.Uint64(w[16:])
		x3 := binary.LittleEndian.Uint64(w[24:])
		if ((x0-lo)&^x0|(x1-lo)&^x1|(x2-lo)&^x2|(x3-lo)&^x3)&highs != 0 {
			return true
		}
	}
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		if (x-lo)&^x&highs != 0 {
			return true
		}
	}
	for ; i < len(b); i++ {
		if b[i] < 0x20 {
			return true
		}
	}
	return false
}
