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
		v, err := jsonscan.Member(data, "tokens")
		if err != nil {
			return 0, fmt.Errorf("backend %s: tokenize: %w", b.spec.Name, err)
		}
		if *ids, ok = parseIDs((*ids)[:0], v); !ok || len(*ids) != n {
			return 0, fmt.Errorf("backend %s: tokenize: tokens is not a list of the count's %d token ids", b.spec.Name, n)
		}
	}
	return n, nil
}

// parseIDs appends to dst the token ids of a JSON array of non-negative
// integers below 2^32; ok is false for anything else.
func parseIDs(dst []uint32, v []byte) ([]uint32, bool) {
	i := 0
	space := func() {
		for i < len(v) && (v[i] == ' ' || v[i] == '\t' || v[i] == '\n' || v[i] == '\r') {
			i++
		}
	}
	space()
	if i == len(v) || v[i] != '[' {
		return dst, false
	}
	i++
	space()
	if i < len(v) && v[i] == ']' {
		i++
		space()
		return dst, i == len(v)
	}
	for {
		start, n := i, uint64(0)
		for i < len(v) && v[i] >= '0' && v[i] <= '9' && i-start < 10 {
			n = n*10 + uint64(v[i]-'0')
			i++
		}
		// JSON writes no leading zero, and no id has more than ten digits.
		if i == start || n > math.MaxUint32 || i < len(v) && v[i] >= '0' && v[i] <= '9' || v[start] == '0' && i-start > 1 {
			return dst, false
		}
		dst = append(dst, uint32(n))
		space()
		if i == len(v) {
			return dst, false
		}
		switch v[i] {
		case ',':
			i++
			space()
		case ']':
			i++
			space()
			return dst, i == len(v)
		default:
			return dst, false
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
