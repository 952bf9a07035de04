package gateway

import (
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission"
)

// Pooling requests (embeddings, pooling, classify, score, rerank) are
// admitted by their prompts alone. The backend runs each input as one
// prefill: it holds the input's KV blocks while it computes them and
// frees them when the answer is pooled, decoding nothing. So the
// reservation is the inputs' blocks, held from admission to the end of
// the answer, and there is no stream to follow: the answer comes whole,
// as a non-streamed completion's does, and its usage is read the same way.

// reservePooling is the pooling APIs' reservation step.
func reservePooling(x *exchange, ctx *fasthttp.RequestCtx, prompts []int, exact []bool) bool {
	return x.reserved(ctx, x.reservePooling(prompts, exact))
}

// poolingAdmission is how a pooling request runs: whole, never stopped.
func poolingAdmission(*exchange) admission.Request { return admission.Request{Opaque: true} }

// reservePooling turns the inputs' token counts into the reservation, or
// into the 400 an input over the model's context length gets (only an
// exact count proves one too long; an estimate that says so is held to
// the context, and the backend judges).
//
// Each input is one group of one sequence that holds exactly Blocks(p),
// its prompt's blocks: a backend running a pooling request allocates
// slots for the tokens it computes, the prompt, and none for a token to
// decode. admission.Group sizes a group as Blocks(Prompt+Cap) and needs a
// Cap of at least 1, so the input is Prompt p−1 with Cap 1: the last
// prompt token stands in the output's place. Prompt p with Cap 1 would
// hold a block too many whenever p fills its last block exactly. The
// groups share nothing (no prefix chains): a conservative hold, since a
// pooling model's backend may not cache prefixes.
func (x *exchange) reservePooling(prompts []int, exact []bool) *apiError {
	m, req := x.m, x.req
	outs := x.outsFor(len(prompts))
	for i, p := range prompts {
		if t := req.pool.truncate; t > 0 && p > t {
			p = t // vLLM keeps the last t tokens of the input
		}
		if p > m.maxLen {
			if exact[i] {
				return &apiError{status: 400, typ: typeInvalidRequest, code: "context_length_exceeded", param: req.inputParam(),
					message: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens in the input. Please reduce the length of the input.", m.maxLen, p)}
			}
			p = m.maxLen
		}
		x.predicted += p
		prompts[i], outs[i] = max(p-1, 0), 1
	}
	x.chains = nil
	x.res = newReservation(m.layout, prompts, outs, 1, 1, &x.one)
	return nil
}
