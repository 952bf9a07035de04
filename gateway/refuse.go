package gateway

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/kvbudget"
)

// ended reports how the request's context ended, if it has.
func (x *exchange) ended() (outcome, reason string, e *apiError) {
	switch cause := x.rctx.Cause(); {
	case cause == nil:
		return "", "", nil
	case errors.Is(cause, errRequestTimeout):
		return outcomeFailed, "request_timeout", &apiError{status: 504, typ: typeServer, code: "upstream_timeout",
			message: fmt.Sprintf("The request did not complete within %s.", x.rt.cfg.Server.RequestTimeout.D)}
	case errors.Is(cause, errFirstByteTimeout):
		name, d := "", time.Duration(0)
		if x.backend != nil {
			name, d = x.backend.Name(), x.backend.FirstByteTimeout()
		}
		return outcomeFailed, "first_byte_timeout", &apiError{status: 504, typ: typeServer, code: "upstream_timeout",
			message: fmt.Sprintf("The backend %q sent nothing within %s (its first_byte_timeout).", name, d)}
	case errors.Is(cause, errShutdown):
		return outcomeFailed, "shutdown", &apiError{status: 503, typ: typeServer, code: "shutting_down", message: "The gateway is shutting down."}
	case errors.Is(cause, errStoppedForMemory):
		return outcomeShed, reasonGuard, &apiError{status: 503, typ: typeServer, code: reasonGuard, retryAfter: guardRetryAfter,
			message: fmt.Sprintf("The requests running on this GPU outgrew their forecast: this one was stopped to keep the GPU's KV cache within its budget. Retry after %s.", retryAfterText(guardRetryAfter))}
	default:
		// The client hung up, or only shut its sending side (connwatch
		// cannot tell the two apart). One that still reads must not take
		// what it gets for a whole answer: it gets this error, and one that
		// is gone never sees it.
		return outcomeCanceled, "client_disconnect", &apiError{status: statusClientClosed, typ: typeInvalidRequest, code: "client_closed_request",
			message: "The client closed its side of the connection before the answer was complete; the gateway takes that for a hang-up and cancelled the request."}
	}
}

// statusClientClosed is nginx's 499, "client closed request": the client
// ended the exchange itself, so the answer is a client error (4xx), and one
// that still reads learns its request was cancelled, not served.
const statusClientClosed = 499

// guardRetryAfter is what a request the guard stopped is told: the
// requests that outgrew the forecast hold the room it needs for some
// seconds, while the GPU is on worst-case admission.
const guardRetryAfter = 2 * time.Second

// admissionError is the answer to a refusal by admission other than the
// request's own end (admission.ReasonCanceled, which ended says).
func (x *exchange) admissionError(err error) (e *apiError, outcome, reason string) {
	reason = admission.ReasonOf(err)
	var rej *admission.RejectError
	if errors.As(err, &rej) {
		x.access.waited = rej.Waited
	}
	switch reason {
	case admission.ReasonTooLarge:
		param := x.req.lengthParam()
		if x.req.kind.pooling() {
			param = x.req.inputParam()
		}
		e := &apiError{status: 400, typ: typeInvalidRequest, code: "kv_budget_exceeded", param: param, noRetry: true,
			message: fmt.Sprintf("This request needs %s of KV cache (%d prompt tokens, up to %d output tokens each, %d sequences), more than the whole budget of any GPU serving model `%s` (%s). %s",
				kvbudget.FormatBytes(x.res.weight()), x.predicted, x.res.maxOut(), x.req.seqs, x.req.model, kvbudget.FormatBytes(rej.Capacity), x.lowerHint())}
		if x.rt.count {
			e.message = fmt.Sprintf("This request cannot be admitted by model `%s`'s concurrency limit.", x.req.model)
		}
		return e, outcomeRejected, "kv_budget_exceeded"
	case admission.ReasonTenantQuota:
		// Only a request larger than the tenant's whole share gets here (one
		// that merely finds its tenant at its cap waits): retrying cannot
		// help, and the client is told not to.
		return &apiError{status: 429, typ: typeRateLimit, code: reason, noRetry: true,
			message: fmt.Sprintf("This request needs %s of KV cache, more than your tenant may hold at once on any GPU serving model `%s` (%s). %s",
				kvbudget.FormatBytes(x.res.weight()), x.req.model, kvbudget.FormatBytes(rej.Capacity), x.lowerHint())}, outcomeShed, reason
	case admission.ReasonNoRoute:
		return noBackend(x.req.model), outcomeFailed, "no_backend"
	case admission.ReasonQueueFull, admission.ReasonQueueTimeout, admission.ReasonOverloaded:
		msg := map[string]string{
			admission.ReasonQueueFull:    "The admission queue is full.",
			admission.ReasonQueueTimeout: "The request could not be admitted within its queue deadline.",
			admission.ReasonOverloaded:   "The GPU is under memory pressure and this request's priority class is being shed.",
		}[reason]
		if field := x.rt.cfg.queueingOff(x.class); reason == admission.ReasonQueueFull && field != "" {
			msg = fmt.Sprintf("No GPU serving model `%s` has room for this request now, and queueing is disabled (%s is negative).", x.req.model, field)
		}
		return &apiError{status: 429, typ: typeRateLimit, code: reason, retryAfter: rej.RetryAfter,
			message: fmt.Sprintf("%s It needs %s of KV cache; retry after %s.", msg, kvbudget.FormatBytes(x.res.weight()), retryAfterText(rej.RetryAfter))}, outcomeShed, reason
	}
	return &apiError{status: 500, typ: typeServer, message: err.Error()}, outcomeFailed, "internal"
}

// lowerHint is how a request too large to admit can be made smaller. One
// that sets no length (LangChain and the AI SDK omit it by default) is told
// that this is why: without max_tokens the whole remaining context is
// reserved for its output.
func (x *exchange) lowerHint() string {
	if x.req.kind.pooling() {
		return "Send fewer or shorter inputs."
	}
	if x.req.kind == responsesAPI && x.req.maxTokens == 0 && x.injectMax == 0 {
		return fmt.Sprintf("Set max_output_tokens: without it the whole remaining context, %d tokens, is reserved for the output.", x.res.maxOut())
	}
	if x.req.maxTokens == 0 && x.injectMax == 0 {
		return fmt.Sprintf("Set max_tokens or max_completion_tokens: without it the whole remaining context, %d tokens, is reserved for the output.", x.res.maxOut())
	}
	if x.req.kind.typedEvents() {
		return fmt.Sprintf("Lower %s, or shorten the prompt.", x.req.lengthParam())
	}
	return "Lower max_tokens or n, or shorten the prompt."
}

func noBackend(model string) *apiError {
	return &apiError{status: 503, typ: typeServer, code: "no_healthy_backend",
		message: fmt.Sprintf("No healthy backend serves the model `%s` right now.", model)}
}
