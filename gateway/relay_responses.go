package gateway

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/kvgate/kvgate/internal/sse"
)

// The streams of the Responses and Messages APIs are typed events: each
// an "event:" line and a JSON object whose "type" names it. The relay
// reads them as it reads chat's chunks: each piece of generated text (a
// Responses ".delta" event, a Messages content_block_delta) is at least
// one token of the only sequence, counted as tally.go says (these
// APIs put no usage on their deltas: events, or bytes of text once the
// backend's final usage has shown its events short); the event that
// carries the usage finishes it; the
// API's last event (response.completed, .incomplete or .failed;
// message_stop; an error) ends the stream as [DONE] ends chat's.

// inspectTyped is inspect for a typed stream: what the relay acts on in
// one event (see inspect).
func (x *exchange) inspectTyped(p *fastjson.Parser, ev []byte) (keep, failed, last bool) {
	data := sse.Data(ev)
	if data == nil {
		return true, false, false
	}
	if string(data) == "[DONE]" { // not these APIs' way, but an end all the same
		return true, false, true
	}
	v, err := p.ParseBytes(data)
	if err != nil || v.Type() != fastjson.TypeObject {
		return true, false, false
	}
	typ := string(v.GetStringBytes("type"))
	if typ == "error" {
		msg := v.GetStringBytes("message") // the Responses API's
		if e := v.Get("error"); e != nil {
			msg = e.GetStringBytes("message") // Anthropic's
		}
		if bytes.Contains(msg, outOfMemory) {
			x.overflowed()
		}
		return true, true, true
	}
	if x.req.kind == messagesAPI {
		return true, false, x.anthropicEvent(v, typ)
	}
	return true, typ == "response.failed", x.responsesEvent(v, typ)
}

// responsesEvent acts on one event of a Responses stream; true for its
// last.
func (x *exchange) responsesEvent(v *fastjson.Value, typ string) bool {
	x.req.gen.seq = v.GetInt("sequence_number")
	switch typ {
	case "response.completed", "response.incomplete", "response.failed":
		r := v.Get("response")
		x.readUsage(r.Get("usage"))
		x.finished(0, string(r.GetStringBytes("incomplete_details", "reason")) == "max_output_tokens")
		if bytes.Contains(r.GetStringBytes("error", "message"), outOfMemory) {
			x.overflowed()
		}
		return true
	}
	// Text, reasoning, a refusal, a tool call's arguments: each delta is
	// output the backend generated.
	if n := len(v.GetStringBytes("delta")); n > 0 && strings.HasSuffix(typ, ".delta") {
		x.token(0, n, -1)
	}
	return false
}

// anthropicEvent acts on one event of a Messages stream; true for its
// last.
func (x *exchange) anthropicEvent(v *fastjson.Value, typ string) bool {
	switch typ {
	case "content_block_delta":
		d := v.Get("delta")
		for _, k := range [...]string{"text", "thinking", "partial_json"} {
			if n := len(d.GetStringBytes(k)); n > 0 {
				x.token(0, n, -1)
				break
			}
		}
	case "message_start":
		if u := v.Get("message", "usage"); u != nil && u.Type() == fastjson.TypeObject {
			x.usage.prompt, x.hasUsage = u.GetInt("input_tokens"), true
		}
	case "message_delta":
		// Its usage is the output's, and the input's too where the
		// backend repeats it.
		if u := v.Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
			x.usage.completion, x.hasUsage = u.GetInt("output_tokens"), true
			if n := u.GetInt("input_tokens"); n > 0 {
				x.usage.prompt = n
			}
			x.checkEvents(x.usage.completion)
		}
		if sr := v.Get("delta", "stop_reason"); sr != nil && sr.Type() == fastjson.TypeString {
			x.finished(0, string(sr.GetStringBytes()) == "max_tokens")
		}
	case "message_stop":
		return true
	}
	return false
}

// learnTyped is learnWhole for a whole Responses or Messages answer: one
// sequence, its length the usage's output, capped when the answer says
// it stopped at its length field.
func (x *exchange) learnTyped(v *fastjson.Value) {
	if !x.hasUsage || len(x.res.prompts) != 1 {
		return
	}
	capped := string(v.GetStringBytes("incomplete_details", "reason")) == "max_output_tokens" ||
		string(v.GetStringBytes("stop_reason")) == "max_tokens"
	if prompt, n, ok := x.res.finish(0, x.usage.completion); ok {
		x.ticket.Done(prompt, n, capped)
	}
}

// streamError ends a stream that has already begun with an error event in
// its API's shape: chat's and completions' (writeStreamError), the
// Responses API's error event, or Anthropic's.
func (x *exchange) streamError(w *bufio.Writer, e *apiError) {
	if x.req == nil || !x.req.kind.typedEvents() {
		writeStreamError(w, e)
		return
	}
	w.WriteString("event: error\ndata: ")
	var b []byte
	if x.req.kind == messagesAPI {
		status := e.status
		if e.code == reasonGuard {
			status = 503
		}
		b = appendAnthropicErrorObject(append(b, `{"type":"error","error":`...), status, e.message)
		b = append(b, '}')
	} else {
		code := e.code
		if code == "" {
			code = e.typ
		}
		b = jsonscan.AppendString(append(b, `{"type":"error","code":`...), code)
		b = jsonscan.AppendString(append(b, `,"message":`...), e.message)
		b = append(b, `,"param":null,"sequence_number":`...)
		b = strconv.AppendInt(b, int64(x.req.gen.seq+1), 10)
		b = append(b, '}')
	}
	w.Write(b)
	w.WriteString("\n\n")
	w.Flush()
}
