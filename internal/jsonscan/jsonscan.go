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
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil, errors.New("answer is not a JSON object")
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return nil, fmt.Errorf("%w %q", ErrNoMember, key)
	}
	for i < len(data) {
		if data[i] != '"' {
			return nil, fmt.Errorf("malformed JSON at byte %d", i)
		}
		end, err := skipString(data, i)
		if err != nil {
			return nil, err
		}
		name := data[i+1 : end-1]
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return nil, fmt.Errorf("malformed JSON at byte %d", i)
		}
		i = skipSpace(data, i+1)
		end, err = skipValue(data, i)
		if err != nil {
			return nil, err
		}
		if string(name) == key {
			return data[i:end], nil
		}
		i = skipSpace(data, end)
		switch {
		case i < len(data) && data[i] == ',':
			i = skipSpace(data, i+1)
		case i < len(data) && data[i] == '}':
			return nil, fmt.Errorf("%w %q", ErrNoMember, key)
		default:
			return nil, fmt.Errorf("malformed JSON at byte %d", i)
		}
	}
	return nil, errors.New("truncated JSON")
}

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
