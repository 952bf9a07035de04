package gateway

import (
	"github.com/valyala/fastjson"
)

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
