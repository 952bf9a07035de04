package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// apiError is an error as vLLM's OpenAI server returns it:
// {"error":{"message","type","param","code"}} where code is the HTTP status
// as a number, type is e.g. "BadRequestError" and param names the request
// field at fault (null when none).
type apiError struct {
	status int
	typ    string
	param  string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(param, format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: param, msg: fmt.Sprintf(format, a...)}
}

func modelNotFound(model string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "NotFoundError", param: "model",
		msg: fmt.Sprintf("The model `%s` does not exist.", model)}
}

func serverError(err error) *apiError {
	return &apiError{status: http.StatusInternalServerError, typ: "InternalServerError", msg: err.Error()}
}

func unavailable(err error) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: err.Error()}
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// appendJSON appends the error body.
func (e *apiError) appendJSON(dst []byte) []byte {
	info := errorInfo{Message: e.msg, Type: e.typ, Code: e.status}
	if e.param != "" {
		info.Param = &e.param
	}
	b, err := json.Marshal(struct {
		Error errorInfo `json:"error"`
	}{info})
	if err != nil { // a struct of strings and an int always marshals
		panic(fmt.Sprintf("sim: marshal error body: %v", err))
	}
	return append(dst, b...)
}
