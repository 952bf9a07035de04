package gateway

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/valyala/fasthttp"
)

// apiError is an error in OpenAI's shape:
// {"error":{"message","type","param","code"}}.
type apiError struct {
	status     int
	typ        string
	code       string // "" is null
	param      string // "" is null
	message    string
	retryAfter time.Duration // > 0 sets Retry-After and retry-after-ms
	// noRetry tells clients that waiting cannot help (x-should-retry:
	// false, which the official OpenAI clients obey).
	noRetry bool
}

// The OpenAI error types the gateway uses.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
)

// keptHeaders outlive an error's reset of the answer: they are about the
// request and the client (its id, what its page may read), not the answer
// the error replaces.
var keptHeaders = [...]string{headerRequestID, "Access-Control-Allow-Origin", "Access-Control-Expose-Headers"}

func (e *apiError) write(ctx *fasthttp.RequestCtx) {
	var kept [len(keptHeaders)][]byte
	for i, h := range keptHeaders {
		if v := ctx.Response.Header.Peek(h); len(v) > 0 {
			kept[i] = append([]byte(nil), v...)
		}
	}
	ctx.Response.Reset()
	for i, v := range kept {
		if v != nil {
			ctx.Response.Header.SetBytesV(keptHeaders[i], v)
		}
	}
	ctx.SetStatusCode(e.status)
	ctx.SetContentType("application/json")
	if e.retryAfter > 0 {
		// Retry-After is whole seconds; the official clients read
		// retry-after-ms first, so they come back when the room is expected.
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(retryAfterSeconds(e.retryAfter)))
		ctx.Response.Header.Set("Retry-After-Ms", strconv.FormatInt(max(e.retryAfter.Milliseconds(), 1), 10))
	}
	if e.noRetry {
		ctx.Response.Header.Set("X-Should-Retry", "false")
	}
	ctx.SetBody(e.appendJSON(nil, true))
}

// appendJSON appends e in OpenAI's error shape. A message may quote what the
// client sent (a model name with any bytes in it), so it is written with
// JSON's own escapes. A stream's error event carries no param, as vLLM's
// does not.
func (e *apiError) appendJSON(dst []byte, withParam bool) []byte {
	dst = jsonscan.AppendString(append(dst, `{"error":{"message":`...), e.message)
	dst = jsonscan.AppendString(append(dst, `,"type":`...), e.typ)
	if withParam {
		dst = appendNullOr(append(dst, `,"param":`...), e.param)
	}
	dst = appendNullOr(append(dst, `,"code":`...), e.code)
	return append(dst, "}}"...)
}

func appendNullOr(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "null"...)
	}
	return jsonscan.AppendString(dst, s)
}

// retryAfterSeconds rounds up to whole seconds, at least 1: a client told
// "0" would retry at once, which is what shedding is there to prevent.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// retryAfterText is d for a message: "1.4s", or whole seconds from 10s on.
func retryAfterText(d time.Duration) string {
	if d >= 10*time.Second {
		return strconv.Itoa(retryAfterSeconds(d)) + "s"
	}
	return strconv.FormatFloat(math.Ceil(d.Seconds()*10)/10, 'f', -1, 64) + "s"
}

// internalError is the 500 of a request the gateway itself failed.
func internalError() *apiError {
	return &apiError{status: 500, typ: typeServer, code: "internal_error", message: "internal error"}
}

// unknownModel is the 404 of a request for a model the gateway does not
// serve.
func unknownModel(model string) *apiError {
	return &apiError{status: 404, typ: typeInvalidRequest, param: "model", code: "model_not_found",
		message: fmt.Sprintf("The model `%s` does not exist.", model)}
}

// badJSON is the 400 of a body that is not the JSON it says it is.
func badJSON(err error) *apiError {
	return &apiError{status: 400, typ: typeInvalidRequest, message: fmt.Sprintf("We could not parse the JSON body of your request: %v", err)}
}
