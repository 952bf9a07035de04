package gateway

import (
	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission"
)

// Chat and completions, as their entries in the table of routes
// (routes.go) take them: read by parseRequest (parse.go), their prompts
// found by promptTexts and reserved by reserve (reservation.go), and run as
// below.

// reserveCompletion is chat's and completions' reservation step.
func reserveCompletion(x *exchange, ctx *fasthttp.RequestCtx, prompts []int, exact []bool) bool {
	return x.reserved(ctx, x.reserve(prompts, exact))
}

// completionAdmission is how a chat or completion runs: a stream may be
// stopped by the guard, and resumed when its body can be continued.
func completionAdmission(x *exchange) admission.Request {
	req := x.req
	areq := admission.Request{Opaque: !req.stream, Pinned: req.pinned}
	if req.stream {
		areq.Stopper = x
		if req.resumable && x.rt.resumes {
			x.resume = newResumeState()
		}
		// A tool call ends what a continuation can carry, found only
		// while the answer streams: such a request is taken as one that
		// cannot be resumed where admission decides up front. With
		// resume_stopped off every stop is a cut, which the operator
		// chose over holding streams at their worst case.
		areq.NoResume = x.rt.resumes && (x.resume == nil || req.tools)
	}
	return areq
}
