package gateway

import (
	"sync/atomic"
	"time"

	"github.com/valyala/fastjson"
)

// tally is an exchange's counting: what its prompts were counted as and
// how, the reservation made of them, and the tokens its answer generated
// as they come — reported to its ticket as progress, observed as
// latencies — and at its end as the backend's usage (usage.go).
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
	// carry several tokens (tokencount.go); nil until first read.
	merges *atomic.Bool
}

// token counts what an event told of choice idx: textBytes of generated
// text (0: none) and the backend's count of its tokens so far (reported
// < 0: none). See tokencount.go.
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
// (tokencount.go): a completion's text, or in a chat's delta the content,
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
