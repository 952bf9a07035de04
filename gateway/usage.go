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
