package gateway

import (
	"bytes"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/internal/jsonscan"
)

// tally is an exchange's counting: what its prompts were counted as and
// how, the reservation made of them, and the tokens its answer generated
// as they come — reported to its ticket as progress, observed as
// latencies — and at its end as the backend's usage (readUsage, recordUsage).
type tally struct {
	res reservation
	one oneChoice // res's slices, for one prompt and one choice

	predicted int // prompt tokens reserved, all prompts
	// counts and exact hold countPrompts' answer for a single prompt.
	counts    [1]int
	exact     [1]bool
	injectMax int // max_tokens the gateway adds to the body (the model's default); 0 = none

	// source is how the prompts were counted (sourceBackend, ...); "" for
	// token ids only. A single prompt counted from the model's tokenize
	// cache keeps its key, to be checked against the usage reported.
	source     string
	cacheHit   bool
	cacheKey   tokenKey
	cacheCount int
	// chains name each prompt's leading full blocks (prefix.go) when a GPU
	// of the model shares them; nil where a prompt's were not seen.
	chains [][]uint64

	firstTok bool
	lastTok  time.Time // the first choice's last token, for the inter-token latency
	usage    struct{ prompt, completion int }
	hasUsage bool
	// merges is the flag of the stream's backend that says its events
	// carry several tokens (eventCounting, below); nil until first read.
	merges *atomic.Bool
}

// token counts what an event told of choice idx: textBytes of generated
// text (0: none) and the backend's count of its tokens so far (reported
// < 0: none). See choiceCount.
func (x *exchange) token(idx, textBytes, reported int) {
	if textBytes > 0 {
		x.firstToken()
		if idx == 0 {
			x.interToken()
		}
	}
	if prompt, furthest, moved := x.res.token(idx, textBytes, reported, x.countedByBytes()); moved {
		x.ticket.Progress(prompt, furthest)
	}
}

// finished notes that choice idx finished, by its length cap or not: its
// blocks go back at once.
func (x *exchange) finished(idx int, capped bool) {
	if prompt, n, ok := x.res.finish(idx, -1); ok {
		x.ticket.Done(prompt, n, capped)
	}
}

// generatedBytes is the bytes of what a streamed choice carries that its
// sequence generated (0: nothing), which the relay counts as tokens
// (choiceCount): a completion's text, or in a chat's delta the content,
// the reasoning of a reasoning model (vLLM's "reasoning", formerly
// "reasoning_content") or a piece of a tool call (its name and arguments;
// one byte at least). Each is output the backend holds KV blocks for; a
// stream that counted only content would report no progress while a model
// reasons or calls a tool, and its reservation would fall behind what it
// holds.
func generatedBytes(c *fastjson.Value) int {
	n := len(c.GetStringBytes("text"))
	d := c.Get("delta")
	if d == nil {
		return n
	}
	for _, k := range generatedKeys {
		n += len(d.GetStringBytes(k))
	}
	if calls := d.GetArray("tool_calls"); len(calls) > 0 {
		t := 0
		for _, tc := range calls {
			t += len(tc.GetStringBytes("function", "name")) + len(tc.GetStringBytes("function", "arguments"))
		}
		n += max(t, 1)
	}
	return n
}

var generatedKeys = [...]string{"content", "reasoning", "reasoning_content"}

// firstToken observes the time to the first token, once per request.
func (x *exchange) firstToken() {
	if !x.firstTok {
		x.firstTok = true
		x.access.ttft = x.s.now().Sub(x.start)
		x.s.m.forModel(x.m.name).ttft.Observe(x.access.ttft.Seconds())
	}
}

// interToken observes the time since the first choice's previous token:
// one sequence's pace, which the other choices of the request share (a
// backend steps every running sequence together).
func (x *exchange) interToken() {
	now := x.s.now()
	if !x.lastTok.IsZero() {
		x.s.m.forModel(x.m.name).itl.Observe(now.Sub(x.lastTok).Seconds())
	}
	x.lastTok = now
}

func (x *exchange) readUsage(u *fastjson.Value) {
	if u == nil || u.Type() != fastjson.TypeObject {
		return
	}
	x.usage.prompt, x.usage.completion = u.GetInt("prompt_tokens"), u.GetInt("completion_tokens")
	if x.req.kind.typedEvents() { // the Responses and Messages APIs' names
		x.usage.prompt, x.usage.completion = u.GetInt("input_tokens"), u.GetInt("output_tokens")
	}
	if x.usage.prompt == 0 && x.req.kind.pooling() {
		x.usage.prompt = u.GetInt("total_tokens") // a rerank's usage has only its total
	}
	x.checkEvents(x.usage.completion)
	if rs := x.resume; rs != nil && rs.carried > 0 {
		// A resumed stream's backend counted what the stopped exchange had
		// generated as prompt: it is the answer's.
		moved := min(rs.carried, x.usage.prompt)
		x.usage.prompt -= moved
		x.usage.completion += moved
	}
	x.hasUsage = true
}

// resumedUsage is a resumed stream's usage event as the client is told it:
// prompt and completion as one exchange would have counted them.
func resumedUsage(v, u *fastjson.Value, prompt, completion int) []byte {
	var a fastjson.Arena
	u.Set("prompt_tokens", a.NewNumberInt(prompt))
	u.Set("completion_tokens", a.NewNumberInt(completion))
	out := append([]byte("data: "), v.MarshalTo(nil)...)
	return append(out, "\n\n"...)
}

// learnWhole teaches the model's output-length predictor what a
// non-streamed answer generated: only a single choice's length is known
// (usage counts all choices together).
func (x *exchange) learnWhole(v *fastjson.Value) {
	if x.req.kind.typedEvents() {
		x.learnTyped(v) // relay_responses.go
		return
	}
	choices := v.GetArray("choices")
	if !x.hasUsage || len(choices) != 1 || len(x.res.prompts) != 1 {
		return
	}
	if fr := choices[0].Get("finish_reason"); fr != nil && fr.Type() == fastjson.TypeString {
		if prompt, n, ok := x.res.finish(0, x.usage.completion); ok {
			x.ticket.Done(prompt, n, string(fr.GetStringBytes()) == "length")
		}
	}
}

// recordUsage compares what was reserved with what the backend reports, and
// calibrates the estimate tokenizer against it.
func (x *exchange) recordUsage() {
	ms := x.s.m.forModel(x.m.name)
	ts := x.s.m.forTenant(x.m.name, x.tenant)
	ts.predicted[0].Add(float64(x.predicted))
	ts.actual[0].Add(float64(x.usage.prompt))
	if !x.req.kind.pooling() { // a pooling request's one-token cap is its prompt's last token
		ts.predicted[1].Add(float64(x.res.reservedOutput()))
	}
	ts.actual[1].Add(float64(x.usage.completion))
	if x.ticket != nil {
		ms.outPredicted.Add(float64(x.ticket.PredictedOutput()))
		ms.outGenerated.Add(float64(x.usage.completion))
	}
	if x.resume != nil && x.resume.carried > 0 {
		// A resumed stream's prompt was counted again with its generated
		// text: it says nothing of how well the prompt was estimated.
		return
	}
	if x.predicted > 0 && x.usage.prompt > 0 {
		source := x.source
		if source == "" {
			source = x.m.tokenizer
		}
		ms.ratio[source].Observe(float64(x.usage.prompt) / float64(x.predicted))
	}
	x.checkCached()
	if (x.req.kind == responsesAPI || x.req.kind == messagesAPI) && x.source != sourceEstimate && x.source != "" &&
		x.usage.prompt > x.predicted && !x.m.converted.Swap(true) {
		x.s.log.Warn("the backend counts Responses or Messages prompts above the chat request they convert to; estimating them from now on",
			"model", x.m.name, "counted", x.predicted, "prompt_tokens", x.usage.prompt)
	}
	if len(x.req.shapes) == 1 && !x.req.shapes[0].ids && x.usage.prompt > 0 && x.m.est.observe(x.req.shapes[0], x.usage.prompt) {
		x.s.log.Info("a prompt passed its estimate; estimating by the byte bound until calibration is earned again",
			"model", x.m.name, "prompt_tokens", x.usage.prompt)
	}
}

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
