package backends

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/valyala/fasthttp"
)

// maxTokenizeAnswer bounds a /tokenize answer. vLLM lists every token id
// (about 7 bytes each), so a 128k-token prompt answers close to 1 MiB.
const maxTokenizeAnswer = 16 << 20

// tokenizeBufs holds the buffers answers are read into; only the count is
// kept, so the buffer goes straight back.
var tokenizeBufs = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// Tokenize asks the backend's /tokenize (vLLM's API) how many tokens body
// holds; body is a /tokenize request ({"model", "prompt"} or {"model",
// "messages"}). Of the answer only "count" is read: the list of token ids
// beside it is skipped, not parsed.
func (b *Backend) Tokenize(ctx context.Context, body []byte) (int, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	b.NewRequest(req, fasthttp.MethodPost, "/tokenize")
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	r, err := b.Do(ctx, req)
	if err != nil {
		return 0, err
	}
	bp := tokenizeBufs.Get().(*[]byte)
	defer tokenizeBufs.Put(bp)
	data, err := r.readInto((*bp)[:0], maxTokenizeAnswer)
	*bp = data[:0]
	if err != nil {
		return 0, fmt.Errorf("backend %s: tokenize: %w", b.spec.Name, err)
	}
	if r.Status() != fasthttp.StatusOK {
		return 0, &StatusError{Backend: b.spec.Name, Status: r.Status(), Body: append([]byte(nil), data...)}
	}
	v, err := jsonMember(data, "count")
	if err != nil {
		return 0, fmt.Errorf("backend %s: tokenize: %w", b.spec.Name, err)
	}
	n, ok := parseCount(v)
	if !ok {
		return 0, fmt.Errorf("backend %s: tokenize: count is %.40q, not a token count", b.spec.Name, v)
	}
	return n, nil
}

// readInto appends the whole body to dst, refusing more than max bytes,
// and closes the response.
func (r *Response) readInto(dst []byte, max int64) ([]byte, error) {
	defer r.Close()
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if int64(len(dst)) > max {
			return dst, fmt.Errorf("%w: response body over %d bytes", ErrUpstream, max)
		}
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// parseCount reads a non-negative JSON integer.
func parseCount(v []byte) (int, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

var errNoMember = errors.New("no such member")

// jsonMember returns the raw value of the first member named key of the
// JSON object data, skipping every other member's value without decoding
// it. Keys are compared as written (a key spelled with escapes does not
// match). It checks only as much syntax as it needs to find its way.
func jsonMember(data []byte, key string) ([]byte, error) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil, errors.New("answer is not a JSON object")
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return nil, fmt.Errorf("%w %q", errNoMember, key)
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
			return nil, fmt.Errorf("%w %q", errNoMember, key)
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

// skipString returns the index just past the string that opens at i.
func skipString(data []byte, i int) (int, error) {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, errors.New("truncated JSON string")
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
