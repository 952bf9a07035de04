package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// api is the shape a route answers in.
type api int

const (
	apiChat api = iota
	apiCompletions
	apiResponses
	apiMessages
	apiEmbeddings
	apiRerank
)

var apiNames = [...]string{"chat", "completions", "responses", "messages", "embeddings", "rerank"}

func (a api) String() string { return apiNames[a] }

// outcome is how the client saw an answer.
type outcome int

const (
	answered  outcome = iota // a whole 200
	refused                  // an error status with an error in the API's shape
	failedEnd                // a 200 stream that ended with an error event
	broken                   // a 200 that is not whole: a false success
	unshaped                 // an error status without an error in the API's shape
)

// verdict is an answer judged: its outcome and, for an error, its reason
// (OpenAI's error.code, else its type; Anthropic's error.type), or what
// is wrong with it.
type verdict struct {
	outcome outcome
	reason  string
	message string // an error's message
}

// judge reads an answer by its API's rules.
func judge(a api, stream bool, status int, body []byte) verdict {
	if status != 200 {
		if reason, msg, ok := errorReason(a, body); ok {
			return verdict{refused, fmt.Sprintf("%d %s", status, reason), msg}
		}
		return verdict{outcome: unshaped, reason: fmt.Sprintf("%d %.120q", status, body)}
	}
	if stream {
		return judgeStream(a, body)
	}
	if whole(a, body) {
		return verdict{outcome: answered}
	}
	return verdict{outcome: broken, reason: fmt.Sprintf("200 %s not whole: %.120q", a, body)}
}

// errorReason reads an error body in the API's shape: Anthropic's
// {"type":"error","error":{"type","message"}} for Messages, OpenAI's
// {"error":{"message","type","code"}} for the others.
func errorReason(a api, body []byte) (reason, message string, ok bool) {
	var e struct {
		Type  string `json:"type"`
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		return "", "", false
	}
	if a == apiMessages {
		return e.Error.Type, e.Error.Message, e.Type == "error"
	}
	if c, ok := e.Error.Code.(string); ok && c != "" {
		return c, e.Error.Message, true
	}
	return e.Error.Type, e.Error.Message, true
}

// whole says whether a non-streamed 200 is a complete answer of its API.
func whole(a api, body []byte) bool {
	var v struct {
		Object  string            `json:"object"`
		Type    string            `json:"type"`
		Status  string            `json:"status"`
		Choices []json.RawMessage `json:"choices"`
		Output  []json.RawMessage `json:"output"`
		Content []json.RawMessage `json:"content"`
		Stop    *string           `json:"stop_reason"`
		Data    []json.RawMessage `json:"data"`
		Results []json.RawMessage `json:"results"`
	}
	if json.Unmarshal(body, &v) != nil {
		return false
	}
	switch a {
	case apiChat, apiCompletions:
		if len(v.Choices) == 0 {
			return false
		}
		for _, c := range v.Choices {
			var ch struct {
				Finish  *string         `json:"finish_reason"`
				Message json.RawMessage `json:"message"`
				Text    *string         `json:"text"`
			}
			if json.Unmarshal(c, &ch) != nil || ch.Finish == nil || (a == apiChat && ch.Message == nil) || (a == apiCompletions && ch.Text == nil) {
				return false
			}
		}
		return true
	case apiResponses:
		return v.Object == "response" && (v.Status == "completed" || v.Status == "incomplete") && len(v.Output) > 0
	case apiMessages:
		return v.Type == "message" && v.Stop != nil && v.Content != nil
	case apiEmbeddings:
		return len(v.Data) > 0
	case apiRerank:
		return len(v.Results) > 0
	}
	return false
}

// sseEvent is one event of a stream: its name and its data.
type sseEvent struct {
	name string
	data []byte
}

// events splits a stream into its events; rest is what follows the last
// blank line (nothing, in a whole stream).
func events(body []byte) (evs []sseEvent, rest []byte) {
	for {
		i := bytes.Index(body, []byte("\n\n"))
		if i < 0 {
			return evs, body
		}
		var ev sseEvent
		for _, line := range strings.Split(string(body[:i]), "\n") {
			if v, ok := strings.CutPrefix(line, "event:"); ok {
				ev.name = strings.TrimSpace(v)
			} else if v, ok := strings.CutPrefix(line, "data:"); ok {
				ev.data = append(ev.data, strings.TrimPrefix(v, " ")...)
			}
		}
		if ev.name != "" || ev.data != nil {
			evs = append(evs, ev)
		}
		body = body[i+2:]
	}
}

// judgeStream reads a 200 stream: whole when it ends with its API's end
// (chat and completions: data: [DONE]; Responses: response.completed or
// response.incomplete; Messages: message_stop), failed when its last event
// (before [DONE] for chat) is an error, broken otherwise.
func judgeStream(a api, body []byte) verdict {
	evs, rest := events(body)
	if len(bytes.TrimSpace(rest)) > 0 || len(evs) == 0 {
		return verdict{outcome: broken, reason: fmt.Sprintf("200 %s stream cut: %d events, then %.80q", a, len(evs), rest)}
	}
	last := evs[len(evs)-1]
	switch a {
	case apiChat, apiCompletions:
		if string(last.data) != "[DONE]" {
			return verdict{outcome: broken, reason: fmt.Sprintf("200 %s stream without [DONE]: last event %.80q", a, last.data)}
		}
		if len(evs) > 1 {
			if reason, msg, ok := errorReason(a, evs[len(evs)-2].data); ok {
				return verdict{failedEnd, "200 stream error " + reason, msg}
			}
		}
		return verdict{outcome: answered}
	case apiResponses, apiMessages:
		var v struct {
			Type    string `json:"type"`
			Code    string `json:"code"`
			Message string `json:"message"`
			Error   *struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(last.data, &v) != nil {
			return verdict{outcome: broken, reason: fmt.Sprintf("200 %s stream: last event not JSON: %.80q", a, last.data)}
		}
		switch {
		case a == apiResponses && (v.Type == "response.completed" || v.Type == "response.incomplete"):
			return verdict{outcome: answered}
		case a == apiMessages && v.Type == "message_stop":
			return verdict{outcome: answered}
		case v.Type == "error" && a == apiResponses && v.Code != "":
			return verdict{failedEnd, "200 stream error " + v.Code, v.Message}
		case v.Type == "error" && a == apiMessages && v.Error != nil && v.Error.Type != "":
			return verdict{failedEnd, "200 stream error " + v.Error.Type, v.Error.Message}
		}
		return verdict{outcome: broken, reason: fmt.Sprintf("200 %s stream ended without its end or an error event: last %.80q", a, last.data)}
	}
	return verdict{outcome: broken, reason: fmt.Sprintf("200 stream on %s", a)}
}
