package jsonscan

import (
	"unicode/utf8"
)

// AppendString appends s as a JSON string. fastjson quotes a string with
// special characters by strconv.AppendQuote, whose \x00, \a and \U escapes
// are Go, not JSON; this writes JSON's escapes only, and invalid UTF-8 as
// U+FFFD, as encoding/json does.
func AppendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	done := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(append(dst, s[done:i]...), `\ufffd`...)
				done = i + 1
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[done:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		done = i
	}
	return append(append(dst, s[done:]...), '"')
}
