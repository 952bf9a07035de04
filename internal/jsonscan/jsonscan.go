package jsonscan

import (
	"bytes"
	"errors"
	"fmt"
)

// ErrNoMember is returned when the object has no member of that name.
var ErrNoMember = errors.New("no such member")

// Member returns the raw value of the first member named key of the JSON
// object data, skipping every other member's value without decoding it.
// Keys are compared as written (a key spelled with escapes does not
// match). It checks only as much syntax as it needs to find its way, so
// the value of a member found in a malformed document may be returned.
func Member(data []byte, key string) ([]byte, error) {
	var val []byte
	err := Members(data, func(name []byte, _, v, end int) bool {
		if string(name) == key {
			val = data[v:end]
			return false
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if val == nil {
		return nil, fmt.Errorf("%w %q", ErrNoMember, key)
	}
	return val, nil
}

// Members calls fn for each member of the JSON object data, in order, until
// fn returns false: name is the key as written between its quotes (escapes
// not decoded), data[start:end] the whole member from the key's opening
// quote to the end of its value, data[value:end] its value. It checks syntax
// as Member does.
func Members(data []byte, fn func(name []byte, start, value, end int) bool) error {
	_, err := walk(data, "", fn)
	return err
}

// ValueAt returns the offset in data of the value of the first member named
// key, without reading that value or anything after it: for a caller that
// reads a long value (an array of token ids) itself, in one pass.
func ValueAt(data []byte, key string) (int, error) {
	at, err := walk(data, key, func([]byte, int, int, int) bool { return true })
	if err == nil && at < 0 {
		err = fmt.Errorf("%w %q", ErrNoMember, key)
	}
	return at, err
}

// walk is Members, stopping at the member named stop (when not "") before
// its value is skipped, and returning that value's offset (-1 if none).
func walk(data []byte, stop string, fn func(name []byte, start, value, end int) bool) (int, error) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return -1, errors.New("answer is not a JSON object")
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return -1, nil
	}
	for i < len(data) {
		if data[i] != '"' {
			return -1, fmt.Errorf("malformed JSON at byte %d", i)
		}
		start := i
		end, err := skipString(data, i)
		if err != nil {
			return -1, err
		}
		name := data[i+1 : end-1]
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return -1, fmt.Errorf("malformed JSON at byte %d", i)
		}
		i = skipSpace(data, i+1)
		if stop != "" && string(name) == stop {
			return i, nil
		}
		end, err = skipValue(data, i)
		if err != nil {
			return -1, err
		}
		if !fn(name, start, i, end) {
			return -1, nil
		}
		next, more, ok := After(data, end, '}')
		if !ok {
			return -1, fmt.Errorf("malformed JSON at byte %d", next)
		}
		if !more {
			return -1, nil
		}
		i = skipSpace(data, next)
	}
	return -1, errors.New("truncated JSON")
}

// ErrEscapedKey is returned by Lookup for an object with a key written
// with escapes: a JSON parser would match it to a name Lookup cannot.
var ErrEscapedKey = errors.New("object has a key written with escapes")

// Lookup finds, in one pass over the JSON object data, the raw value of the
// first member named keys[i], into out[i] (nil where there is none). Unlike
// Member it walks the whole object and fails on malformed syntax anywhere
// at its top level, and on a key written with escapes (ErrEscapedKey),
// which a parser could read as one of keys.
func Lookup(data []byte, keys []string, out [][]byte) error {
	clear(out[:len(keys)])
	escaped := false
	err := Members(data, func(name []byte, _, value, end int) bool {
		if bytes.IndexByte(name, '\\') >= 0 {
			escaped = true
			return false
		}
		for i, k := range keys {
			if out[i] == nil && string(name) == k {
				out[i] = data[value:end]
			}
		}
		return true
	})
	if escaped {
		return ErrEscapedKey
	}
	return err
}

// Elements calls fn with the raw value of each element of the JSON array
// data, in order, skipping their insides.
func Elements(data []byte, fn func(value []byte)) error {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '[' {
		return errors.New("not a JSON array")
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == ']' {
		return nil
	}
	for i < len(data) {
		end, err := skipValue(data, i)
		if err != nil {
			return err
		}
		fn(data[i:end])
		next, more, ok := After(data, end, ']')
		if !ok {
			return fmt.Errorf("malformed JSON at byte %d", next)
		}
		if !more {
			return nil
		}
		i = skipSpace(data, next)
	}
	return errors.New("truncated JSON")
}

// Skip returns the index just past the JSON value that starts at
// data[i], checking only as much as it needs to find its end: for a
// scanner of its own that walks a document's known shape.
func Skip(data []byte, i int) (int, error) { return skipValue(data, i) }

// After reads what follows a member or element that ends at data[end], in
// an object or array that closes with close: a comma (more follows) or
// close itself, after any space. next is the index past it, or of the
// unexpected byte when ok is false.
func After(data []byte, end int, close byte) (next int, more, ok bool) {
	i := skipSpace(data, end)
	if i < len(data) {
		switch data[i] {
		case ',':
			return i + 1, true, true
		case close:
			return i + 1, false, true
		}
	}
	return i, false, false
}

// SkipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func SkipSpace(data []byte, i int) int { return skipSpace(data, i) }

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string that opens at i: the
// next quote not escaped by an odd run of backslashes.
func skipString(data []byte, i int) (int, error) {
	for j := i + 1; ; {
		k := bytes.IndexByte(data[j:], '"')
		if k < 0 {
			return 0, errors.New("truncated JSON string")
		}
		q := j + k
		slashes := 0
		for p := q - 1; p > i && data[p] == '\\'; p-- {
			slashes++
		}
		if slashes%2 == 0 {
			return q + 1, nil
		}
		j = q + 1
	}
}

// skipValue returns the index just past the value that starts at i.
func skipValue(data []byte, i int) (int, error) {
	if i >= len(data) {
		return 0, errors.New("truncated JSON")
	}
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				end, err := skipString(data, j)
				if err != nil {
					return 0, err
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, errors.New("truncated JSON")
	default: // a number or a literal
		j := i
		for j < len(data) && data[j] != ',' && data[j] != '}' && data[j] != ']' &&
			data[j] != ' ' && data[j] != '\t' && data[j] != '\n' && data[j] != '\r' {
			j++
		}
		if j == i {
			return 0, fmt.Errorf("malformed JSON at byte %d", i)
		}
		return j, nil
	}
}
