package backends

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/internal/jsonscan"
)

// maxTokenizeAnswer bounds a /tokenize answer. vLLM lists every token id
// (about 7 bytes each), so a 128k-token prompt answers close to 1 MiB.
const maxTokenizeAnswer = 16 << 20

// tokenizeBufs holds the buffers answers are read into; only the count is
// kept, so the buffer goes straight back.
var tokenizeBufs = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// tokenize is Tokenize without its timeout. Of the answer "count" is read,
// and, when ids is not nil, the list of token ids into it; otherwise the
// list is skipped, not parsed.
func (b *Backend) tokenize(ctx context.Context, body []byte, ids *[]uint32) (int, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	b.NewRequest(req, fasthttp.MethodPost, "/tokenize")
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	r, err := b.Do(ctx, req)
	if err != nil {
		return 0, err
	}
	defer r.Release()
	bp := tokenizeBufs.Get().(*[]byte)
	defer tokenizeBufs.Put(bp)
	data, err := r.ReadInto((*bp)[:0], maxTokenizeAnswer)
	*bp = data[:0]
	if err != nil {
		return 0, fmt.Errorf("backend %s: tokenize: %w", b.spec.Name, err)
	}
	if r.Status() != fasthttp.StatusOK {
		return 0, &StatusError{Backend: b.spec.Name, Status: r.Status(), Body: append([]byte(nil), data...)}
	}
	v, err := jsonscan.Member(data, "count")
	if err != nil {
		return 0, fmt.Errorf("backend %s: tokenize: %w", b.spec.Name, err)
	}
	n, ok := parseCount(v)
	if !ok {
		return 0, fmt.Errorf("backend %s: tokenize: count is %.40q, not a token count", b.spec.Name, v)
	}
	if ids != nil {
		// The list is read in the one pass that parses it: a 4k-token
		// prompt's is 25 KB, and skipping it first would read it twice.
		at, err := jsonscan.ValueAt(data, "tokens")
		if err != nil {
			return 0, fmt.Errorf("backend %s: tokenize: %w", b.spec.Name, err)
		}
		var end int
		if *ids, end = parseIDList((*ids)[:0], data[at:]); end < 0 || len(*ids) != n {
			return 0, fmt.Errorf("backend %s: tokenize: tokens is not a list of the count's %d token ids", b.spec.Name, n)
		}
	}
	return n, nil
}

// parseIDs appends to dst the token ids of v, a JSON array of
// non-negative integers below 2^32 and nothing else; ok is false for
// anything else.
func parseIDs(dst []uint32, v []byte) ([]uint32, bool) {
	dst, end := parseIDList(dst, v)
	if end < 0 {
		return dst, false
	}
	return dst, skipSpace(v, end) == len(v)
}

// parseIDList appends to dst the token ids of the JSON array of
// non-negative integers below 2^32 that v begins with, and returns the
// offset just past its closing bracket (what follows is not read), or -1.
func parseIDList(dst []uint32, v []byte) ([]uint32, int) {
	i := skipSpace(v, 0)
	if i == len(v) || v[i] != '[' {
		return dst, -1
	}
	if i = skipSpace(v, i+1); i < len(v) && v[i] == ']' {
		return dst, i + 1
	}
	for i < len(v) {
		// A number: JSON writes no leading zero, and no id has more than
		// ten digits.
		start, n := i, uint64(0)
		for ; i < len(v); i++ {
			d := v[i] - '0'
			if d > 9 {
				break
			}
			n = n*10 + uint64(d)
		}
		if l := i - start; l == 0 || l > 10 || n > math.MaxUint32 || v[start] == '0' && l > 1 {
			return dst, -1
		}
		dst = append(dst, uint32(n))
		if i < len(v) && v[i] != ',' && v[i] != ']' {
			i = skipSpace(v, i) // vLLM writes none; other servers may
		}
		switch {
		case i == len(v):
			return dst, -1
		case v[i] == ',':
			i = skipSpace(v, i+1)
		case v[i] == ']':
			return dst, i + 1
		default:
			return dst, -1
		}
	}
	return dst, -1
}

// skipSpace is the offset of the first byte at or after i that is not
// JSON white space.
func skipSpace(v []byte, i int) int {
	for i < len(v) && (v[i] == ' ' || v[i] == '\t' || v[i] == '\n' || v[i] == '\r') {
		i++
	}
	return i
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
