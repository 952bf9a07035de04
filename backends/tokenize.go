package backends

import (
	"context"
	"fmt"
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

// tokenize is Tokenize without its timeout. Of the answer only "count" is
// read: the list of token ids beside it is skipped, not parsed.
func (b *Backend) tokenize(ctx context.Context, body []byte) (int, error) {
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
	return n, nil
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
