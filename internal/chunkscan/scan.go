package chunkscan

import (
	"bytes"

	"github.com/kvgate/kvgate/internal/jsonscan"
)

// Choice0 is what a relay acts on in an event that Scan could
// read: a piece of text (a completion's text, or a chat's delta.content or
// reasoning, not empty: see generated) and a finish reason (nil: none).
type Choice0 struct {
	Text   bool
	Finish []byte
	// Start and End are where the text is in the event (its JSON string,
	// quotes included) when there is one; Reasoning says it is (or an
	// event's texts include) a reasoning model's reasoning rather than the
	// answer's content. A stream kept to be resumed copies the text.
	Start, End int
	Reasoning  bool
}

// TokenOnly says the event is one piece of text and nothing more: most
// events of a stream, and the ones whose shape is learned.
func (c Choice0) TokenOnly() bool { return c.Text && c.Finish == nil }

// Scan reads an event's data when it is certainly about choice 0
// alone and holds nothing else the relay acts on: no error, no usage (null
// is none), one choice, its index 0, its text strings, its finish_reason
// null or a string. Nearly every event of a stream is such — the role, each
// token, the finish — and one forward pass over their bytes tells them at
// a fraction of a parse. Whatever it is not sure of — a key written with
// escapes or repeated, a delta with more than a role and content (tool
// calls), logprobs, several choices, a finish reason with escapes —
// answers false and is parsed. It checks the members it reads, not the
// syntax of those it skips: an event that is not well-formed JSON, which
// only a broken backend sends, is acted on as its bytes say where the
// parse would act on nothing. textStart and textEnd are where a non-empty
// text is (the string, quotes included), when there is one.
func Scan(data []byte) (c Choice0, ok bool) {
	s := eventScan{b: data}
	choices := 0
	ok = s.object(func(key []byte) bool {
		switch string(key) {
		case "choices":
			choices++
			return choices == 1 && s.choice0(&c)
		case "usage":
			return s.null()
		case "error":
			return false
		}
		return s.skip()
	}) && choices == 1 && s.end()
	return c, ok
}

// Shape is the JSON around the text of the last event of a stream that
// Scan read as a token only. A stream's token events differ only in their text
// (vLLM repeats the id, creation time and model in each), and an event that
// is those same bytes around another non-empty JSON string is one as
// surely: every member Scan judges is the same but the text, which
// it asks only to be a string (a token when not empty). So two comparisons
// and a scan of the text tell it, where walking its JSON took most of the
// relay's own work on a stream.
type Shape struct {
	b         [512]byte // b[:pre] comes before the text, b[pre:pre+post] after it
	pre, post int
	reasoning bool // the text is a reasoning's: its key is in b[:pre]
}

// Choice0 is Scan for the next event of the stream.
func (t *Shape) Choice0(data []byte) (Choice0, bool) {
	if t.matches(data) {
		return Choice0{Text: true, Start: t.pre, End: len(data) - t.post, Reasoning: t.reasoning}, true
	}
	c, ok := Scan(data)
	if ok && c.TokenOnly() {
		t.learn(data, c)
	}
	return c, ok
}

func (t *Shape) matches(data []byte) bool {
	pre, post := t.b[:t.pre], t.b[t.pre:t.pre+t.post]
	// Between them, room for a string of one character at least.
	if t.pre == 0 || len(data) < len(pre)+len(post)+3 || !bytes.HasPrefix(data, pre) || !bytes.HasSuffix(data, post) {
		return false
	}
	// ... and one string, from right after pre to right before post.
	end, err := jsonscan.Skip(data, len(pre))
	return err == nil && data[len(pre)] == '"' && end == len(data)-len(post)
}

func (t *Shape) learn(data []byte, c Choice0) {
	t.pre, t.post = 0, 0 // none, unless it fits
	if c.Start+len(data)-c.End <= len(t.b) {
		t.pre = copy(t.b[:], data[:c.Start])
		t.post = copy(t.b[t.pre:], data[c.End:])
		t.reasoning = c.Reasoning
	}
}

// eventScan walks an SSE event's JSON by hand for Scan; every
// method answers false when the bytes are not what it expects.
type eventScan struct {
	b []byte
	i int
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

// str consumes a string, and says whether it is not empty.
func (s *eventScan) str() (nonEmpty, ok bool) {
	v, ok := s.value()
	if !ok || len(v) < 2 || v[0] != '"' {
		return false, false
	}
	return len(v) > 2, true
}

// text consumes a text string, noting where it is when it is not empty;
// reasoning says whose it is (see choice0).
func (s *eventScan) text(c *Choice0, reasoning bool) bool {
	start := s.i
	nonEmpty, ok := s.str()
	if nonEmpty {
		c.Text = true
		c.Start, c.End = start, s.i
		c.Reasoning = c.Reasoning || reasoning
	}
	return ok
}

func (s *eventScan) end() bool { s.space(); return s.i == len(s.b) }

// once says whether the member bit names has not been seen, and marks it:
// the parse reads a repeated member's first value, so the scan refuses
// what it would read twice.
func once(seen *uint8, bit uint8) bool {
	if *seen&bit != 0 {
		return false
	}
	*seen |= bit
	return true
}

// choice0 consumes a choices array of one choice, of index 0, into c.
func (s *eventScan) choice0(c *Choice0) bool {
	if !s.eat('[') {
		return false
	}
	const (
		seenIndex = 1 << iota
		seenDelta
		seenText
		seenLogprobs
		seenFinish
	)
	var seen uint8
	if !s.object(func(key []byte) bool {
		switch string(key) {
		case "index":
			v, ok := s.value()
			return ok && string(v) == "0" && once(&seen, seenIndex)
		case "delta":
			return once(&seen, seenDelta) && s.delta(c)
		case "text":
			return once(&seen, seenText) && s.text(c, false)
		case "logprobs":
			return once(&seen, seenLogprobs) && s.null()
		case "finish_reason":
			return once(&seen, seenFinish) && s.finishReason(c)
		}
		return s.skip()
	}) {
		return false
	}
	more, ok := s.next(']')
	return ok && !more && seen&seenIndex != 0
}

// delta consumes a chat delta of strings — a content, a reasoning (either
// name vLLM has given it) and a role — and nothing else but nulls (tool
// calls are left to the parse).
func (s *eventScan) delta(c *Choice0) bool {
	var seen uint8
	return s.object(func(key []byte) bool {
		switch string(key) {
		case "content":
			return once(&seen, 1) && s.text(c, false)
		case "reasoning":
			return once(&seen, 2) && s.text(c, true)
		case "reasoning_content":
			return once(&seen, 4) && s.text(c, true)
		case "role":
			_, ok := s.str()
			return once(&seen, 8) && ok
		}
		return s.null()
	})
}

// finishReason consumes a finish_reason: null, or a string without
// escapes.
func (s *eventScan) finishReason(c *Choice0) bool {
	v, ok := s.value()
	switch {
	case !ok:
		return false
	case string(v) == "null":
		return true
	case len(v) >= 2 && v[0] == '"' && bytes.IndexByte(v, '\\') < 0:
		c.Finish = v[1 : len(v)-1]
		return true
	}
	return false
}
