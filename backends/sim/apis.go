package sim

import (
	"bufio"
	"strconv"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// vLLM serves two more generation APIs through the engine that serves
// chat: OpenAI's Responses API (/v1/responses) and Anthropic's Messages
// API (/v1/messages). The simulator does as vLLM does: it reads the body
// as a chat request (its messages rendered by the chat template, its
// length field as max_tokens), generates one sequence, and answers in the
// API's own shapes, streamed as that API's typed events.

// api is one of the generation APIs besides chat and completions.
type api uint8

const (
	apiResponses api = iota + 1
	apiMessages
	// apiCountTokens is Anthropic's /v1/messages/count_tokens: a
	// messages body without max_tokens, answered with its prompt's length.
	apiCountTokens
)

// generateAPI serves /v1/responses or /v1/messages as generate serves
// chat: validated in vLLM's order, submitted, answered whole or streamed
// once the first token is out.
func (s *Server) generateAPI(ctx *fasthttp.RequestCtx, a api) {
	p := s.parsers.Get()
	body, aerr := chatBody(p, ctx.PostBody(), a)
	var g genParams
	if aerr == nil {
		g, aerr = parseGenRequest(p, body, true, s.set)
	}
	s.parsers.Put(p)
	if aerr != nil {
		s.writeAPIError(ctx, a, aerr)
		return
	}
	r := s.newRequest(g)
	if err := s.eng.submit(r); err != nil {
		s.writeAPIError(ctx, a, errorFor(err))
		return
	}
	n := s.idSeq.Add(1)
	enc := &apiEncoder{api: a, model: s.modelJSON, created: s.now().Unix(), maxTokens: g.maxTokens,
		id: string(appendHex64(nil, mix(s.idSalt^n))), item: string(appendHex64(nil, mix(s.idSalt+n)))}
	unwatch := s.watchHangup(ctx, r)
	if !g.stream {
		for r.status.Load() == statusActive {
			<-r.wake
		}
		unwatch()
		if r.status.Load() == statusFailed {
			s.writeAPIError(ctx, a, errorFor(r.err))
			return
		}
		sq := &r.seqs[0]
		ctx.SetContentType("application/json")
		ctx.SetBody(enc.whole(nil, sq.key, int(sq.pub.Load()), r.prompt))
		return
	}
	for r.status.Load() == statusActive && !r.started() {
		<-r.wake
	}
	if r.status.Load() == statusFailed && !r.started() {
		unwatch()
		s.writeAPIError(ctx, a, errorFor(r.err))
		return
	}
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) { // the watch stays on: see generate.go
		defer unwatch()
		s.streamAPI(w, r, enc)
	})
}

// streamAPI writes r's events in enc's API until r ends or the client
// goes away.
func (s *Server) streamAPI(w *bufio.Writer, r *request, enc *apiEncoder) {
	buf := s.getBuf()
	defer s.putBuf(buf)
	sq := &r.seqs[0]
	sent := 0
	b := enc.begin((*buf)[:0], r.prompt)
	for {
		st := r.status.Load() // tokens are published before the status
		pub := int(sq.pub.Load())
		ended := pub >= sq.target || st != statusActive
		for end := s.set.nextEvent(sq.key, sent, pub, ended); end > 0; end = s.set.nextEvent(sq.key, sent, pub, ended) {
			b = enc.delta(b, sq.key, sent, end)
			sent = end
		}
		switch st {
		case statusFinished:
			b = enc.end(b, sq.key, sent, r.prompt)
		case statusFailed:
			b = enc.fail(b, errorFor(r.err))
		}
		*buf = b
		if !s.sendEvents(w, b, r) {
			return
		}
		if st != statusActive {
			return
		}
		b = (*buf)[:0]
		<-r.wake
	}
}

// writeAPIError answers with e in a's error shape: OpenAI's for the
// Responses API, Anthropic's for Messages.
func (s *Server) writeAPIError(ctx *fasthttp.RequestCtx, a api, e *apiError) {
	if a != apiMessages && a != apiCountTokens {
		s.writeError(ctx, e)
		return
	}
	ctx.SetStatusCode(e.status)
	ctx.SetContentType("application/json")
	ctx.SetBody(appendAnthropicError(nil, e))
}

// anthropicType is the Anthropic error type of an HTTP status.
func anthropicType(status int) string {
	switch status {
	case 400:
		return "invalid_request_error"
	case 404:
		return "not_found_error"
	case 503:
		return "overloaded_error"
	}
	return "api_error"
}

func appendAnthropicError(dst []byte, e *apiError) []byte {
	return append(appendAnthropicErrorObject(append(dst, `{"type":"error","error":`...), e), '}')
}

// appendAnthropicErrorObject appends the error member's object.
func appendAnthropicErrorObject(dst []byte, e *apiError) []byte {
	dst = append(dst, `{"type":"`...)
	dst = append(dst, anthropicType(e.status)...)
	dst = append(dst, `","message":`...)
	dst = append(dst, jsonString(e.msg)...)
	return append(dst, '}')
}

// chatBody translates a Responses or Messages body into the chat body
// vLLM would run for it: the instructions or system prompt first, then
// each message, its text parts as chat's; the length field as max_tokens.
// Only text is simulated: other item and part types are refused.
func chatBody(p *fastjson.Parser, body []byte, a api) ([]byte, *apiError) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, badRequest("", "JSON decode error: %v", err)
	}
	if v.Type() != fastjson.TypeObject {
		return nil, badRequest("", "Input should be a valid dictionary or object to extract fields from")
	}
	out := []byte{'{'}
	for _, k := range [...]string{"model", "stream", "seed", "cache_salt", "ignore_eos", "min_tokens"} {
		if f := v.Get(k); f != nil {
			out = append(append(append(out, jsonString(k)...), ':'), f.MarshalTo(nil)...)
			out = append(out, ',')
		}
	}
	maxKey := "max_output_tokens"
	if a == apiCountTokens {
		maxKey = "max_tokens" // not required: nothing is generated
	}
	if a == apiMessages {
		maxKey = "max_tokens"
		if f := v.Get(maxKey); f == nil || f.Type() == fastjson.TypeNull {
			return nil, badRequest(maxKey, "max_tokens: Field required")
		}
	}
	if f := v.Get(maxKey); f != nil {
		if f.Type() != fastjson.TypeNumber && f.Type() != fastjson.TypeNull {
			return nil, badRequest(maxKey, "%s: Input should be a valid integer", maxKey)
		}
		out = append(append(out, `"max_tokens":`...), f.MarshalTo(nil)...)
		out = append(out, ',')
	}
	out = append(out, `"messages":[`...)
	var aerr *apiError
	if a == apiMessages || a == apiCountTokens {
		out, aerr = messagesPrompt(out, v)
	} else {
		out, aerr = responsesPrompt(out, v)
	}
	if aerr != nil {
		return nil, aerr
	}
	out = append(out, ']')
	if out, aerr = appendChatTools(out, v.Get("tools"), a); aerr != nil {
		return nil, aerr
	}
	return append(out, '}'), nil
}

// appendChatTools appends the API's tools as the chat tools vLLM renders
// them as: {"type":"function","function":{"name","description",
// "parameters"}}, a Messages tool's input_schema as its parameters. Only
// function tools are simulated.
func appendChatTools(dst []byte, tv *fastjson.Value, a api) ([]byte, *apiError) {
	if tv == nil || tv.Type() == fastjson.TypeNull {
		return dst, nil
	}
	tools, err := tv.Array()
	if err != nil {
		return nil, badRequest("tools", "tools: Input should be a valid list")
	}
	params := "parameters"
	if a == apiMessages {
		params = "input_schema"
	}
	dst = append(dst, `,"tools":[`...)
	for i, t := range tools {
		field := "tools[" + strconv.Itoa(i) + "]"
		ty := string(t.GetStringBytes("type"))
		if a == apiMessages && ty != "" && ty != "custom" || a != apiMessages && ty != "function" {
			return nil, badRequest(field, "%s: only function tools are supported by the simulator, got type %q", field, ty)
		}
		name := t.Get("name")
		if name == nil || name.Type() != fastjson.TypeString {
			return nil, badRequest(field+".name", "%s.name: Field required (a string)", field)
		}
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = name.MarshalTo(append(dst, `{"type":"function","function":{"name":`...))
		if d := t.Get("description"); d != nil && d.Type() != fastjson.TypeNull {
			dst = d.MarshalTo(append(dst, `,"description":`...))
		}
		if p := t.Get(params); p != nil && p.Type() != fastjson.TypeNull {
			dst = p.MarshalTo(append(dst, `,"parameters":`...))
		}
		dst = append(dst, "}}"...)
	}
	return append(dst, ']'), nil
}

// appendMessage appends one chat message of text (a JSON string).
func appendMessage(dst []byte, first bool, role string, text []byte) []byte {
	if !first {
		dst = append(dst, ',')
	}
	dst = append(dst, `{"role":`...)
	dst = append(dst, jsonString(role)...)
	dst = append(dst, `,"content":`...)
	dst = append(dst, text...)
	return append(dst, '}')
}

// textParts is the text of content: a string, or text parts of the types
// given (joined by newlines, as chat's parts are rendered), as a JSON string.
func textParts(c *fastjson.Value, field string, types ...string) ([]byte, *apiError) {
	switch {
	case c == nil || c.Type() == fastjson.TypeNull:
		return []byte(`""`), nil
	case c.Type() == fastjson.TypeString:
		return jsonString(string(c.GetStringBytes())), nil
	case c.Type() != fastjson.TypeArray:
		return nil, badRequest(field, "%s: Input should be a valid string or list", field)
	}
	var text []byte
	parts, _ := c.Array()
	for j, part := range parts {
		ty := string(part.GetStringBytes("type"))
		ok := false
		for _, t := range types {
			ok = ok || ty == t
		}
		tv := part.Get("text")
		if !ok || tv == nil || tv.Type() != fastjson.TypeString {
			return nil, badRequest(field, "%s[%d]: only text parts are supported by the simulator (%v), got %q", field, j, types, ty)
		}
		if j > 0 {
			text = append(text, '\n')
		}
		text = append(text, tv.GetStringBytes()...)
	}
	return jsonString(string(text)), nil
}

func responsesPrompt(dst []byte, v *fastjson.Value) ([]byte, *apiError) {
	first := true
	if in := v.Get("instructions"); in != nil && in.Type() != fastjson.TypeNull {
		if in.Type() != fastjson.TypeString {
			return nil, badRequest("instructions", "instructions: Input should be a valid string")
		}
		dst, first = appendMessage(dst, true, "system", jsonString(string(in.GetStringBytes()))), false
	}
	in := v.Get("input")
	switch {
	case in == nil || in.Type() == fastjson.TypeNull:
		return nil, badRequest("input", "input: Field required")
	case in.Type() == fastjson.TypeString:
		return appendMessage(dst, first, "user", jsonString(string(in.GetStringBytes()))), nil
	case in.Type() != fastjson.TypeArray:
		return nil, badRequest("input", "input: Input should be a valid string or list")
	}
	items, _ := in.Array()
	for i, it := range items {
		field := "input[" + strconv.Itoa(i) + "]"
		role := it.GetStringBytes("role")
		if ty := it.GetStringBytes("type"); role == nil || ty != nil && string(ty) != "message" {
			return nil, badRequest(field, "%s: only message items are supported by the simulator", field)
		}
		text, aerr := textParts(it.Get("content"), field+".content", "input_text", "output_text", "text")
		if aerr != nil {
			return nil, aerr
		}
		dst, first = appendMessage(dst, first, string(role), text), false
	}
	if first {
		return nil, badRequest("input", "input: List should have at least 1 item")
	}
	return dst, nil
}

func messagesPrompt(dst []byte, v *fastjson.Value) ([]byte, *apiError) {
	first := true
	if sys := v.Get("system"); sys != nil && sys.Type() != fastjson.TypeNull {
		text, aerr := textParts(sys, "system", "text")
		if aerr != nil {
			return nil, aerr
		}
		dst, first = appendMessage(dst, true, "system", text), false
	}
	mv := v.Get("messages")
	if mv == nil || mv.Type() != fastjson.TypeArray || len(mv.GetArray()) == 0 {
		return nil, badRequest("messages", "messages: Field required (a non-empty list)")
	}
	for i, m := range mv.GetArray() {
		field := "messages[" + strconv.Itoa(i) + "]"
		role := m.GetStringBytes("role")
		if role == nil {
			return nil, badRequest(field, "%s.role: Field required (a string)", field)
		}
		text, aerr := textParts(m.Get("content"), field+".content", "text")
		if aerr != nil {
			return nil, aerr
		}
		dst, first = appendMessage(dst, first, string(role), text), false
	}
	return dst, nil
}

// apiEncoder writes one request's answers in its API's shapes. seq is a
// Responses stream's sequence_number, which every event carries.
type apiEncoder struct {
	api       api
	model     []byte // the model's name, a JSON string
	created   int64
	maxTokens int
	id, item  string // the response's (or message's) id and its output item's
	seq       int
}

// event appends one typed SSE event: its name, then its data, the type
// first; data appends the other members, each followed by a comma. A
// Responses event ends with its sequence number.
func (e *apiEncoder) event(dst []byte, typ string, data func([]byte) []byte) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, typ...)
	dst = append(dst, "\ndata: {\"type\":\""...)
	dst = append(dst, typ...)
	dst = append(dst, `",`...)
	dst = data(dst)
	if e.api == apiResponses {
		dst = append(dst, `"sequence_number":`...)
		dst = strconv.AppendInt(dst, int64(e.seq), 10)
		e.seq++
	} else {
		dst = dst[:len(dst)-1] // the last comma
	}
	return append(dst, "}\n\n"...)
}

func (e *apiEncoder) finish(gen int) string {
	stop := finishReason(gen, e.maxTokens)
	if e.api == apiMessages {
		if stop == "length" {
			return "max_tokens"
		}
		return "end_turn"
	}
	if stop == "length" {
		return "incomplete"
	}
	return "completed"
}

// response appends a Responses API response object: status
// "in_progress" with no output yet (gen < 0), else the output generated.
func (e *apiEncoder) response(dst []byte, key uint64, gen, prompt int) []byte {
	status := "in_progress"
	if gen >= 0 {
		status = e.finish(gen)
	}
	dst = append(dst, `{"id":"resp_`...)
	dst = append(dst, e.id...)
	dst = append(dst, `","object":"response","created_at":`...)
	dst = strconv.AppendInt(dst, e.created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, e.model...)
	dst = append(dst, `,"status":"`...)
	dst = append(dst, status...)
	dst = append(dst, `","incomplete_details":`...)
	if status == "incomplete" {
		dst = append(dst, `{"reason":"max_output_tokens"}`...)
	} else {
		dst = append(dst, `null`...)
	}
	dst = append(dst, `,"max_output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(e.maxTokens), 10)
	dst = append(dst, `,"output":[`...)
	if gen >= 0 {
		dst = e.message(dst, key, gen, "completed")
	}
	dst = append(dst, `],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"temperature":1.0,"top_p":1.0,"truncation":"disabled","usage":`...)
	if gen < 0 {
		return append(dst, `null}`...)
	}
	dst = append(dst, `{"input_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"input_tokens_details":{"cached_tokens":0},"output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(gen), 10)
	dst = append(dst, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt+gen), 10)
	return append(dst, "}}"...)
}

// message appends the Responses output item of the text generated.
func (e *apiEncoder) message(dst []byte, key uint64, gen int, status string) []byte {
	dst = append(dst, `{"id":"msg_`...)
	dst = append(dst, e.item...)
	dst = append(dst, `","type":"message","role":"assistant","status":"`...)
	dst = append(dst, status...)
	dst = append(dst, `","content":[`...)
	if gen >= 0 {
		dst = append(dst, `{"type":"output_text","annotations":[],"logprobs":null,"text":"`...)
		dst = appendText(dst, key, 0, gen)
		dst = append(dst, `"}`...)
	}
	return append(dst, "]}"...)
}

// anthropicMessage appends a Messages API message: no content yet and
// no stop reason (gen < 0), else the text generated.
func (e *apiEncoder) anthropicMessage(dst []byte, key uint64, gen, prompt int) []byte {
	dst = append(dst, `{"id":"msg_`...)
	dst = append(dst, e.id...)
	dst = append(dst, `","type":"message","role":"assistant","model":`...)
	dst = append(dst, e.model...)
	dst = append(dst, `,"content":[`...)
	if gen >= 0 {
		dst = append(dst, `{"type":"text","text":"`...)
		dst = appendText(dst, key, 0, gen)
		dst = append(dst, `"}],"stop_reason":"`...)
		dst = append(dst, e.finish(gen)...)
		dst = append(dst, '"')
	} else {
		dst = append(dst, `],"stop_reason":null`...)
	}
	dst = append(dst, `,"stop_sequence":null,"usage":{"input_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(max(gen, 0)), 10)
	return append(dst, "}}"...)
}

// whole is the non-streamed answer.
func (e *apiEncoder) whole(dst []byte, key uint64, gen, prompt int) []byte {
	if e.api == apiMessages {
		return e.anthropicMessage(dst, key, gen, prompt)
	}
	return e.response(dst, key, gen, prompt)
}

// begin appends the events a stream opens with, before its first token.
func (e *apiEncoder) begin(dst []byte, prompt int) []byte {
	if e.api == apiMessages {
		dst = e.event(dst, "message_start", func(b []byte) []byte {
			return append(e.anthropicMessage(append(b, `"message":`...), 0, -1, prompt), ',')
		})
		return e.event(dst, "content_block_start", func(b []byte) []byte {
			return append(b, `"index":0,"content_block":{"type":"text","text":""},`...)
		})
	}
	for _, typ := range [...]string{"response.created", "response.in_progress"} {
		dst = e.event(dst, typ, func(b []byte) []byte { return append(e.response(append(b, `"response":`...), 0, -1, prompt), ',') })
	}
	dst = e.event(dst, "response.output_item.added", func(b []byte) []byte {
		return append(e.message(append(b, `"output_index":0,"item":`...), 0, -1, "in_progress"), ',')
	})
	return e.event(dst, "response.content_part.added", func(b []byte) []byte {
		return append(e.itemRef(b), `"part":{"type":"output_text","annotations":[],"text":""},`...)
	})
}

// itemRef appends the members that place a Responses event's text.
func (e *apiEncoder) itemRef(dst []byte) []byte {
	dst = append(dst, `"item_id":"msg_`...)
	dst = append(dst, e.item...)
	return append(dst, `","output_index":0,"content_index":0,`...)
}

// delta appends the event of the text of tokens [from, to) of the
// sequence with key k.
func (e *apiEncoder) delta(dst []byte, k uint64, from, to int) []byte {
	if e.api == apiMessages {
		return e.event(dst, "content_block_delta", func(b []byte) []byte {
			b = append(b, `"index":0,"delta":{"type":"text_delta","text":"`...)
			return append(appendText(b, k, from, to), `"},`...)
		})
	}
	return e.event(dst, "response.output_text.delta", func(b []byte) []byte {
		b = append(e.itemRef(b), `"logprobs":[],"delta":"`...)
		return append(appendText(b, k, from, to), `",`...)
	})
}

// end appends the events a finished stream closes with, usage included.
func (e *apiEncoder) end(dst []byte, key uint64, gen, prompt int) []byte {
	if e.api == apiMessages {
		dst = e.event(dst, "content_block_stop", func(b []byte) []byte { return append(b, `"index":0,`...) })
		dst = e.event(dst, "message_delta", func(b []byte) []byte {
			b = append(b, `"delta":{"stop_reason":"`...)
			b = append(b, e.finish(gen)...)
			b = append(b, `","stop_sequence":null},"usage":{"input_tokens":`...)
			b = strconv.AppendInt(b, int64(prompt), 10)
			b = append(b, `,"output_tokens":`...)
			b = strconv.AppendInt(b, int64(gen), 10)
			return append(b, "},"...)
		})
		return e.event(dst, "message_stop", func(b []byte) []byte { return b })
	}
	dst = e.event(dst, "response.output_text.done", func(b []byte) []byte {
		b = append(e.itemRef(b), `"logprobs":[],"text":"`...)
		return append(appendText(b, key, 0, gen), `",`...)
	})
	dst = e.event(dst, "response.content_part.done", func(b []byte) []byte {
		b = append(e.itemRef(b), `"part":{"type":"output_text","annotations":[],"text":"`...)
		return append(appendText(b, key, 0, gen), `"},`...)
	})
	dst = e.event(dst, "response.output_item.done", func(b []byte) []byte {
		return append(e.message(append(b, `"output_index":0,"item":`...), key, gen, "completed"), ',')
	})
	typ := "response.completed"
	if e.finish(gen) == "incomplete" {
		typ = "response.incomplete"
	}
	return e.event(dst, typ, func(b []byte) []byte { return append(e.response(append(b, `"response":`...), key, gen, prompt), ',') })
}

// fail appends the error event a failed stream ends with.
func (e *apiEncoder) fail(dst []byte, ae *apiError) []byte {
	if e.api == apiMessages {
		return e.event(dst, "error", func(b []byte) []byte {
			return append(appendAnthropicErrorObject(append(b, `"error":`...), ae), ',')
		})
	}
	return e.event(dst, "error", func(b []byte) []byte {
		b = append(b, `"code":"`...)
		b = append(b, ae.typ...)
		b = append(b, `","message":`...)
		b = append(b, jsonString(ae.msg)...)
		return append(b, `,"param":null,`...)
	})
}

// countTokens serves /v1/messages/count_tokens as vLLM does: the body read
// as /v1/messages reads it (its messages rendered by the chat template),
// answered {"input_tokens": n}, nothing generated.
func (s *Server) countTokens(ctx *fasthttp.RequestCtx) {
	p := s.parsers.Get()
	body, aerr := chatBody(p, ctx.PostBody(), apiCountTokens)
	var g genParams
	if aerr == nil {
		g, aerr = parseGenRequest(p, body, true, s.set)
	}
	s.parsers.Put(p)
	if aerr != nil {
		s.writeAPIError(ctx, apiCountTokens, aerr)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(append(strconv.AppendInt([]byte(`{"input_tokens":`), int64(g.promptTokens), 10), '}'))
}
