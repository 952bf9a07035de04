package gateway

import (
	"bytes"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/kvgate/kvgate/internal/jsonscan"
)

// How the relay counts the tokens a stream generates.
//
// The guard, the forecast, the learned lengths, censored samples and a
// resumed stream's remaining max_tokens all act on that count, so it must
// never fall below what the backend holds. An SSE event is not a token:
// vLLM merges the deltas of a stream when its API server lags the engine,
// --stream-interval N sends every N tokens, speculative decoding emits
// several per step. In order of preference the count is:
//
//   - reported: the backend's own, from the cumulative usage vLLM puts on
//     every chunk when asked (stream_options.continuous_usage_stats, which
//     the gateway adds where it adds include_usage; the relay strips it
//     from what the client did not ask for);
//   - bounded: where no chunk carries usage and the backend has been seen
//     to send fewer events than tokens (a final usage above the events
//     counted), the bytes of text generated: a token is at least one byte
//     in byte-level BPE and in SentencePiece with byte fallback, so bytes
//     are never fewer than tokens;
//   - the events that carried text, each at least one token: exact for a
//     backend that sends one token an event, until it shows otherwise.
//
// A backend found to merge events is counted by bytes from then on, by
// every stream of its model, those running too.

// choiceCount is what the relay has seen of one choice's output.
type choiceCount struct {
	events   int // events that carried text: each at least one token
	bytes    int // bytes of text: at least one per token
	reported int // the backend's cumulative count, when hasReport
	// hasReport: a chunk carried the backend's count for this choice.
	hasReport bool
	// count is the count last returned; step the most one event moved
	// it: the backend may be that far ahead of the gateway when its next
	// event comes.
	count, step int
}

// note adds one event's worth (textBytes of text, the backend's count
// reported or < 0) and returns the choice's count: reported where the
// backend gives it, else its events or, with byBytes, its bytes.
func (c *choiceCount) note(textBytes, reported int, byBytes bool) int {
	if textBytes > 0 {
		c.events++
		c.bytes += textBytes
	}
	if reported >= 0 {
		c.reported, c.hasReport = max(c.reported, reported), true
	}
	n := c.events
	switch {
	case c.hasReport:
		n = max(c.reported, c.events)
	case byBytes:
		n = max(c.bytes, c.events)
	}
	n = max(n, c.count)
	c.step = max(c.step, n-c.count)
	c.count = n
	return n
}

// ahead is how many tokens past its count the choice's sequence may be
// before its next event tells: an event's worth, less the one the count
// has. The guard takes what a stream may hold before its next report to
// be its count and the next block; with several tokens an event, the
// backend runs that much further between reports.
func (c *choiceCount) ahead() int { return max(c.step-1, 0) }

// eventsShort says whether a final usage of completion tokens shows the
// choices' events below the tokens they carried: more tokens than events,
// beyond the one token a sequence may end with and show nothing for (an
// end-of-sequence token, which the text leaves out). Streams whose chunks
// carried usage are counted by it and say nothing of their events.
func eventsShort(counts []choiceCount, completion int) bool {
	events := 0
	for _, c := range counts {
		if c.hasReport {
			return false
		}
		events += c.events
	}
	return completion > events+len(counts)
}

// eventCounting remembers the backends whose streams were seen to carry
// several tokens an event, per model: their streams are counted by bytes
// (byBytes). It lives as long as the server: a reload keeps what was seen.
type eventCounting struct {
	mu      sync.Mutex
	byBytes map[[2]string]*atomic.Bool // guarded by mu; the flags are read without it
}

// flag is the flag of model's streams on backend, made on first use.
func (ec *eventCounting) flag(model, backend string) *atomic.Bool {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	if ec.byBytes == nil {
		ec.byBytes = map[[2]string]*atomic.Bool{}
	}
	k := [2]string{model, backend}
	f := ec.byBytes[k]
	if f == nil {
		f = new(atomic.Bool)
		ec.byBytes[k] = f
	}
	return f
}

// countedByBytes says whether this exchange's stream counts bytes, its
// backend known to merge events.
func (x *exchange) countedByBytes() bool {
	if x.merges == nil {
		if x.backend == nil || x.m == nil {
			return false
		}
		x.merges = x.s.counting.flag(x.m.name, x.backend.Name())
	}
	return x.merges.Load()
}

// checkEvents compares a streamed exchange's final usage (completion, as
// the backend reported it, before a resumed stream's carried tokens) with
// the events its relay counted; a backend shown to merge events is counted
// by bytes from then on.
func (x *exchange) checkEvents(completion int) {
	if !x.req.stream || x.backend == nil || !eventsShort(x.res.counts, completion) || x.countedByBytes() {
		return
	}
	x.merges.Store(true)
	x.s.m.mergedEvents.WithLabelValues(x.m.name, x.backend.Name()).Inc()
	x.s.log.Warn("backend streams several tokens per event; counting its streams by bytes of text",
		"backend", x.backend.Name(), "model", x.m.name)
}

// textBytes is the length in UTF-8 of the text a JSON string's contents
// (escapes as written, no quotes) stand for: the bytes a tokenizer saw.
func textBytes(escaped []byte) int {
	if bytes.IndexByte(escaped, '\\') < 0 {
		return len(escaped)
	}
	n := 0
	for i := 0; i < len(escaped); {
		if escaped[i] != '\\' || i+1 >= len(escaped) {
			n++
			i++
			continue
		}
		if escaped[i+1] != 'u' || i+6 > len(escaped) {
			n++ // \n, \", \\ ...: one byte
			i += 2
			continue
		}
		r, err := strconv.ParseUint(string(escaped[i+2:i+6]), 16, 32)
		i += 6
		if err != nil {
			n++
			continue
		}
		if utf16.IsSurrogate(rune(r)) && i+6 <= len(escaped) && escaped[i] == '\\' && escaped[i+1] == 'u' {
			if lo, err := strconv.ParseUint(string(escaped[i+2:i+6]), 16, 32); err == nil {
				if pair := utf16.DecodeRune(rune(r), rune(lo)); pair != utf8.RuneError {
					n += utf8.RuneLen(pair)
					i += 6
					continue
				}
			}
		}
		if l := utf8.RuneLen(rune(r)); l > 0 {
			n += l
		} else {
			n += 3 // a lone surrogate: decoded as U+FFFD
		}
	}
	return n
}

// usageKey is how a chunk's usage member begins in vLLM's chunks, where
// it is the last member.
var usageKey = []byte(`,"usage":`)

// usageAtEnd is where usageKey begins when it opens the chunk's last
// member and that member is an object (`,"usage":{...}}`, as vLLM writes
// every chunk under continuous_usage_stats), found from the chunk's end by
// reading that object alone, backwards; -1 where it is not plainly so (a
// string with an escaped quote, the key inside the object), and the
// caller searches the whole chunk. Where it answers it is what
// bytes.LastIndex(data, usageKey) would (TestUsageAtEnd, FuzzCutUsage).
func usageAtEnd(data []byte) int {
	i := lastNonSpace(data, len(data)-1)
	if i < 0 || data[i] != '}' { // the chunk's end
		return -1
	}
	end := lastNonSpace(data, i-1)
	if end < 0 || data[end] != '}' { // its last member's end
		return -1
	}
	depth := 0
	for i = end; i >= 0; i-- {
		switch data[i] {
		case '}':
			depth++
		case '{':
			if depth--; depth > 0 {
				continue
			}
			if bytes.Contains(data[i:end+1], usageKey) {
				return -1
			}
			if k := lastNonSpace(data, i-1) + 1; bytes.HasSuffix(data[:k], usageKey) {
				return k - len(usageKey)
			}
			return -1
		case '"': // a string's end: back to its start, unless it escapes a quote
			j := bytes.LastIndexByte(data[:i], '"')
			if j < 1 || data[i-1] == '\\' || data[j-1] == '\\' {
				return -1
			}
			i = j
		}
	}
	return -1
}

// lastNonSpace is the index of the last byte of data[:i+1] that is not
// JSON whitespace; -1 if none.
func lastNonSpace(data []byte, i int) int {
	for i >= 0 && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i--
	}
	return i
}

// cutUsage finds a chunk's trailing usage member (vLLM writes it last,
// `,"usage":{...}}`) and returns the chunk without it, built in buf, and
// the usage's completion_tokens. ok is false where the chunk has no such
// member, or a usage that is null or without completion_tokens: the
// parse reads those.
func cutUsage(data, buf []byte) (cut []byte, completion int, ok bool) {
	at := usageAtEnd(data)
	if at < 0 {
		at = bytes.LastIndex(data, usageKey)
	}
	if at < 0 {
		return nil, 0, false
	}
	start := jsonscan.SkipSpace(data, at+len(usageKey))
	if start >= len(data) || data[start] != '{' {
		return nil, 0, false
	}
	end, err := jsonscan.Skip(data, start)
	if err != nil {
		return nil, 0, false
	}
	if rest := bytes.TrimSpace(data[end:]); len(rest) != 1 || rest[0] != '}' {
		return nil, 0, false
	}
	completion = -1
	if jsonscan.Members(data[start:end], func(name []byte, _, value, vend int) bool {
		if string(name) == "completion_tokens" {
			v := data[start+value : start+vend]
			if n, err := strconv.Atoi(string(v)); err == nil && n >= 0 {
				completion = n
			}
		}
		return true
	}) != nil || completion < 0 {
		return nil, 0, false
	}
	cut = append(append(buf[:0], data[:at]...), data[end:]...)
	return cut, completion, true
}
