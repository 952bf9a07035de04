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
		b.resp.Release()
		b.x.finish(outcomeCanceled, "client_disconnect")
	}
	return nil
}

// tokenOfChoice0 reports whether an event's data is certainly one
// non-empty piece of text of choice 0 and holds nothing else the relay acts
// on: no error, no usage (null is none), one choice, its index 0, its
// finish_reason null or absent, its text (a chat's delta.content, a
// completion's text) a non-empty string. Most events of a stream are such,
// and one forward pass over their bytes tells them at a fraction of a
// parse. Whatever it is not sure of — a key written with escapes, a delta
// with more than content (a role, tool calls), logprobs, several choices, a
// repeated "choices" — answers false and is parsed.
func tokenOfChoice0(data []byte) bool {
	ok, _, _ := tokenText(data)
	return ok
}

// tokenText is tokenOfChoice0, and where the text it found is:
// data[start:end], quotes included.
func tokenText(data []byte) (ok bool, start, end int) {
	s := eventScan{b: data}
	choices := 0
	ok = s.object(func(key []byte) bool {
		switch string(key) {
		case "choices":
			choices++
			return choices == 1 && s.choice0()
		case "usage":
			return s.null()
		case "error":
			return false
		}
		return s.skip()
	}) && choices == 1 && s.end()
	return ok, s.textStart, s.textEnd
}

// tokenShape is the JSON around the text of the last event of a stream that
// tokenOfChoice0 passed. A stream's token events differ only in their text
// (vLLM repeats the id, creation time and model in each), and an event that
// is those same bytes around another non-empty JSON string is one as
// surely: every member tokenOfChoice0 judges is the same but the text,
// which it asks only to be a non-empty string. So two comparisons and a
// scan of the text tell it, where walking its JSON took most of the
// relay's own work on a stream.
type tokenShape struct {
	b         [512]byte // b[:pre] comes before the text, b[pre:pre+post] after it
	pre, post int
}

// token is tokenOfChoice0 for the next event of the stream.
func (t *tokenShape) token(data []byte) bool {
	if t.matches(data) {
		return true
	}
	ok, start, end := tokenText(data)
	if ok {
		t.learn(data, start, end)
	}
	return ok
}

func (t *tokenShape) matches(data []byte) bool {
	pre, post := t.b[:t.pre], t.b[t.pre:t.pre+t.post]
	// Between them, room for a string of one character at least.
	if t.pre == 0 || len(data) < len(pre)+len(post)+3 || !bytes.HasPrefix(data, pre) || !bytes.HasSuffix(data, post) {
		return false
	}
	// ... and one string, from right after pre to right before post.
	end, err := jsonscan.Skip(data, len(pre))
	return err == nil && data[len(pre)] == '"' && end == len(data)-len(post)
}

func (t *tokenShape) learn(data []byte, start, end int) {
	t.pre, t.post = 0, 0 // none, unless it fits
	if start+len(data)-end <= len(t.b) {
		t.pre = copy(t.b[:], data[:start])
		t.post = copy(t.b[t.pre:], data[end:])
	}
}

// eventScan walks an SSE event's JSON by hand for tokenOfChoice0; every
// method answers false when the bytes are not what it expects.
type eventScan struct {
	b []byte
	i int
	// textStart and textEnd are where the last text passed is.
	textStart, textEnd int
}

func (s *eventScan) space() { s.i = jsonscan.SkipSpace(s.b, s.i) }

// eat consumes c if it comes next after any space: an opening bracket, or
// the closing one of an empty object.
func (s *eventScan) eat(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// next consumes what follows a member or element: a comma (more) or the
// closing c.
func (s *eventScan) next(c byte) (more, ok bool) {
	s.i, more, ok = jsonscan.After(s.b, s.i, c)
	return more, ok
}

// object consumes an object, handing each member's name to member, which
// consumes its value.
func (s *eventScan) object(member func(key []byte) bool) bool {
	if !s.eat('{') {
		return false
	}
	for more := !s.eat('}'); more; {
		key, ok := s.key()
		if !ok || !member(key) {
			return false
		}
		if more, ok = s.next('}'); !ok {
			return false
		}
	}
	return true
}

// key consumes a member's name and its colon; a name with escapes is
// refused.
func (s *eventScan) key() ([]byte, bool) {
	s.space()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	// Names are short: a byte loop finds the closing quote (and refuses
	// an escape) sooner than two IndexByte calls would.
	start := s.i + 1
	end := start
	for ; end < len(s.b) && s.b[end] != '"'; end++ {
		if s.b[end] == '\\' {
			return nil, false
		}
	}
	if end >= len(s.b) {
		return nil, false
	}
	name := s.b[start:end]
	s.i = end + 1
	s.space()
	if s.i >= len(s.b) || s.b[s.i] != ':' {
		return nil, false
	}
	s.i++
	s.space()
	return name, true
}

// value consumes a value and returns its bytes.
func (s *eventScan) value() ([]byte, bool) {
	end, err := jsonscan.Skip(s.b, s.i)
	if err != nil {
		return nil, false
	}
	v := s.b[s.i:end]
	s.i = end
	return v, true
}

func (s *eventScan) skip() bool { _, ok := s.value(); return ok }

func (s *eventScan) null() bool { v, ok := s.value(); return ok && string(v) == "null" }

// text consumes a string and says whether it is not empty.
func (s *eventScan) text() bool {
	start := s.i
	v, ok := s.value()
	if !ok || len(v) <= 2 || v[0] != '"' {
		return false
	}
	s.textStart, s.textEnd = start, s.i
	return true
}

func (s *eventScan) end() bool { s.space(); return s.i == len(s.b) }

// choice0 consumes a choices array of one choice, of index 0, with text
// and no finish_reason.
func (s *eventScan) choice0() bool {
	if !s.eat('[') {
		return false
	}
	index, text := false, false
	if !s.object(func(key []byte) bool {
		switch string(key) {
		case "index":
			v, ok := s.value()
			index = ok && string(v) == "0"
			return index
		case "delta":
			text = s.contentOnly()
			return text
		case "text":
			text = s.text()
			return text
		case "logprobs", "finish_reason":
			return s.null()
		}
		return s.skip()
	}) {
		return false
	}
	more, ok := s.next(']')
	return ok && !more && index && text
}

// contentOnly consumes a delta with a non-empty content and nothing else
// but nulls (no role, no tool calls).
func (s *eventScan) contentOnly() bool {
	content := false
	return s.object(func(key []byte) bool {
		if string(key) != "content" {
			return s.null()
		}
		if content {
			return false
		}
		content = s.text()
		return content
	}) && content
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
