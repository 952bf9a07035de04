package gateway

import (
	"bufio"
	"bytes"
	"io"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/jsonscan"
)

// sseBody is a streamed answer as fasthttp writes it. fasthttp's
// SetBodyStreamWriter runs the writer in a goroutine of its own that feeds
// a pipe, which the connection's goroutine copies to the client: two
// goroutine hand-offs and a copy per event. sseBody instead lets fasthttp
// call WriteTo on the connection's goroutine (fasthttp.BodyWriterTo), where
// every flush of the relay's writer is one chunk on the wire. The relay
// itself — what is kept, when it flushes, how the exchange finishes — is
// the same either way.
//
// Exactly one of WriteTo, Read (a fallback should fasthttp ever read the
// body instead) or Close starts the relay or, when the body is never
// written (the client went away before the headers), finishes the exchange.
type sseBody struct {
	x       *exchange
	resp    *backends.Response
	er      *eventReader // the stream, its first event already read
	first   []byte
	started bool
	pipe    io.ReadCloser // the fallback's pipe, once Read was called
}

var (
	_ fasthttp.BodyWriterTo = (*sseBody)(nil)
	_ io.ReadCloser         = (*sseBody)(nil)
)

// sseWriters buffer events between flushes, as fasthttp's own stream
// writers do.
var sseWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4096) }}

func (b *sseBody) SupportsBodyWriteTo() bool { return true }

// WriteTo runs the relay; w frames each write as one chunk and flushes it.
func (b *sseBody) WriteTo(w io.Writer) (int64, error) {
	if b.started {
		return 0, io.ErrClosedPipe
	}
	b.started = true
	cw := &countWriter{w: w}
	bw := sseWriters.Get().(*bufio.Writer)
	bw.Reset(cw)
	b.x.relay(bw, b.resp, b.er, b.first)
	bw.Reset(nil)
	sseWriters.Put(bw)
	return cw.n, nil // a failed write was the relay's to handle (the client went away)
}

func (b *sseBody) Read(p []byte) (int, error) {
	if b.pipe == nil {
		if b.started {
			return 0, io.ErrClosedPipe
		}
		b.started = true
		b.pipe = fasthttp.NewStreamReader(func(w *bufio.Writer) { b.x.relay(w, b.resp, b.er, b.first) })
	}
	return b.pipe.Read(p)
}

// Close ends the body after fasthttp wrote it, or instead of writing it.
func (b *sseBody) Close() error {
	switch {
	case b.pipe != nil:
		return b.pipe.Close() // the relay's next write fails and it finishes
	case !b.started:
		b.started = true
		b.er.release()
		b.resp.Close()
		b.x.finish(outcomeCanceled, "client_disconnect")
	}
	return nil
}

var (
	keyUsage        = []byte(`"usage"`)
	keyError        = []byte(`"error"`)
	keyFinishReason = []byte(`"finish_reason"`)
)

// plainToken reports whether an event's data certainly holds nothing the
// relay acts on beyond its tokens: no usage, no error, and no choice whose
// finish_reason is set. Most events of a stream are such, and telling them
// by their bytes costs a fraction of parsing them. Keys are found as
// bytes: a quoted key cannot appear whole inside a JSON string (its quotes
// would be escaped there) except as a false positive at a string's end,
// which only costs the parse this skips; keys spelled with \u escapes,
// which no server writes, would be missed.
func plainToken(data []byte) bool {
	if bytes.Contains(data, keyUsage) || bytes.Contains(data, keyError) {
		return false
	}
	for rest := data; ; {
		i := bytes.Index(rest, keyFinishReason)
		if i < 0 {
			return true
		}
		rest = bytes.TrimLeft(rest[i+len(keyFinishReason):], " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			return false
		}
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		if !bytes.HasPrefix(rest, []byte("null")) {
			return false
		}
		rest = rest[len("null"):]
	}
}

var (
	keyIndex      = []byte(`"index"`)
	keyContent    = []byte(`"content"`)
	keyText       = []byte(`"text"`)
	chatToken     = []byte(`[{"index":0,"delta":{"content":"`)
	completionTok = []byte(`[{"index":0,"text":"`)
)

// firstChoiceToken reports whether an event's data is, to the byte, one
// non-empty piece of text of choice 0, as vLLM writes a token of a chat
// ("choices":[{"index":0,"delta":{"content":"…"}…}]) or of a completion
// ("choices":[{"index":0,"text":"…"}…]), with one index and one content or
// text key in the whole event. Anything else — another layout, tool calls,
// logprobs, several choices — answers false and is parsed.
func firstChoiceToken(data []byte) bool {
	if bytes.Count(data, keyIndex) != 1 || bytes.Count(data, keyContent)+bytes.Count(data, keyText) != 1 {
		return false
	}
	choices, err := jsonscan.Member(data, "choices")
	if err != nil {
		return false
	}
	for _, pat := range [][]byte{chatToken, completionTok} {
		if bytes.HasPrefix(choices, pat) {
			return len(choices) > len(pat) && choices[len(pat)] != '"' // the string is not empty
		}
	}
	return false
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
