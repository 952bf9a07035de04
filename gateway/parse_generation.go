package gateway

import (
	"fmt"
	"hash/maphash"
	"strconv"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/internal/jsonscan"
)

// The generation APIs vLLM serves besides chat and completions: OpenAI's
// Responses API and Anthropic's Messages API. vLLM runs each as a chat:
// its instructions or system prompt and its messages rendered by the
// chat template, one sequence generated up to its length field. So each
// is read into a chat's prompt shape and reserved as a chat is; only the
// fields, the stream's events and the error shapes differ.

// generationInputs is what the gateway reads of a Responses or Messages
// request besides what a chat has.
type generationInputs struct {
	// prior: a Responses request continues a stored one
	// (previous_response_id, conversation): the backend puts that
	// conversation, which the gateway cannot see, before the input.
	prior bool
	// plain: the prompt is text messages only, which the backend's
	// /tokenize can count as a chat's (see generationTexts).
	plain bool
	// seq is the sequence_number of the last event of a Responses
	// stream, so that an error event the gateway ends it with follows on.
	seq int
}

// The keys the gateway reads of each body (see topLevelKeys), and of the
// objects within.
var (
	responsesKeys = []string{"model", "input", "instructions", "max_output_tokens", "stream", "tools",
		"previous_response_id", "conversation", "background", "min_tokens", "ignore_eos", "cache_salt", "user"}
	messagesKeys = []string{"model", "messages", "system", "max_tokens", "stream", "tools", "min_tokens", "ignore_eos", "cache_salt"}
	itemKeys     = []string{"type", "role", "content"}
)

// parseGeneration reads a Responses or Messages body with p, as
// parseRequest reads a chat's: one reading by the backend's rules (a
// duplicate key refused, an integer past int64 a 400 naming its field),
// of the fields that size the request: the prompt (instructions or
// system, and the messages), the length field, the stream. The
// returned request does not refer to p's memory.
func parseGeneration(p *fastjson.Parser, body []byte, kind endpoint) (*request, error) {
	keys, lengthKey := responsesKeys, "max_output_tokens"
	if kind == messagesAPI {
		keys, lengthKey = messagesKeys, "max_tokens"
	}
	v, r, err := openBody(p, body, kind, keys)
	if err != nil {
		return nil, err
	}
	if err := r.readStream(v); err != nil {
		return nil, err
	}
	// Both APIs end a stream with its usage, unasked: there is no usage
	// chunk to ask for on the client's behalf.
	r.includeUsage = true
	switch mt := v.Get(lengthKey); {
	case (mt == nil || mt.Type() == fastjson.TypeNull) && kind == messagesAPI:
		return nil, badParam(lengthKey, "max_tokens: Field required")
	case mt != nil && mt.Type() != fastjson.TypeNull:
		n, err := lengthParam(mt, lengthKey)
		if err != nil {
			return nil, err
		}
		r.maxTokens, r.maxTokensParam = n, lengthKey
	}
	if err := r.readPinned(v); err != nil {
		return nil, err
	}
	if err := r.readCacheSalt(v); err != nil {
		return nil, err
	}
	var s promptShape
	var first []byte // the prompt's first text, for affinity
	r.gen.plain = true
	if kind == responsesAPI {
		first, err = r.readResponsesInput(v, &s)
	} else {
		first, err = r.readAnthropicMessages(v, &s)
	}
	if err != nil {
		return nil, err
	}
	if tools := v.Get("tools"); tools != nil && tools.Type() != fastjson.TypeNull {
		s.addJSON(tools.MarshalTo(nil))
		s.tools = len(tools.GetArray())
	}
	r.oneShape[0] = s
	r.shapes = r.oneShape[:]
	if u := v.Get("user"); u != nil && u.Type() == fastjson.TypeString {
		r.user = string(u.GetStringBytes())
	}
	if len(first) > 0 {
		r.prefix = maphash.Bytes(affinitySeed, first[:min(len(first), affinityPrefix)]) | 1
	}
	return r, nil
}

// readResponsesInput reads a Responses request's prompt: instructions
// (a string), then input — a string, or a list of items: messages whose
// content is a string or a list of parts (input_text, output_text, ...),
// and the other items a conversation holds (function calls and their
// outputs, reasoning), each of which is prompt text to the backend.
func (r *request) readResponsesInput(v *fastjson.Value, s *promptShape) (first []byte, err error) {
	// A background response is answered at once and generated after: the
	// gateway would have let its reservation go long before the backend
	// lets its blocks go.
	if bg := v.Get("background"); bg != nil && bg.Type() != fastjson.TypeNull {
		b, err := bg.Bool()
		if err != nil {
			return nil, badParam("background", "background must be a boolean")
		}
		if b {
			return nil, badParam("background", "background responses are not served through this gateway: it holds a request's KV reservation until its answer ends, and a background response's answer ends before it is generated. Send it without background (streamed, if it is long)")
		}
	}
	for _, name := range [...]string{"previous_response_id", "conversation"} {
		f := v.Get(name)
		if f == nil || f.Type() == fastjson.TypeNull {
			continue
		}
		if name == "previous_response_id" && f.Type() != fastjson.TypeString {
			return nil, badParam(name, "%s must be a string", name)
		}
		r.gen.prior = true
	}
	if in := v.Get("instructions"); in != nil && in.Type() != fastjson.TypeNull {
		if in.Type() != fastjson.TypeString {
			return nil, badParam("instructions", "instructions must be a string")
		}
		first = in.GetStringBytes()
		s.addText(first)
		s.messages++
	}
	in := v.Get("input")
	switch {
	case in == nil || in.Type() == fastjson.TypeNull:
		return nil, badParam("input", "you must provide an input")
	case in.Type() == fastjson.TypeString:
		s.addText(in.GetStringBytes())
		s.messages++
		if first == nil {
			first = in.GetStringBytes()
		}
		return first, nil
	case in.Type() != fastjson.TypeArray:
		return nil, badParam("input", "input must be a string or an array of items")
	}
	items, _ := in.Array()
	if len(items) == 0 {
		return nil, badParam("input", "input must not be empty")
	}
	return r.readInputItems(items, s, first)
}

// readInputItems reads the Responses API's input items into the prompt's
// shape; first is the first text read so far, and the first text after
// all of them.
func (r *request) readInputItems(items []*fastjson.Value, s *promptShape, first []byte) ([]byte, error) {
	for i, it := range items {
		param := fmt.Sprintf("input[%d]", i)
		if it.Type() != fastjson.TypeObject {
			return nil, badParam(param, "each input item must be an object")
		}
		if dup := jsonscan.Duplicate(it, itemKeys); dup != "" {
			return nil, duplicateKey(param + "." + dup)
		}
		ty := it.Get("type")
		if ty != nil && ty.Type() != fastjson.TypeString {
			return nil, badParam(param+".type", "type must be a string")
		}
		role := it.Get("role")
		if role == nil && (ty == nil || string(ty.GetStringBytes()) == "message") {
			return nil, badParam(param+".role", "each message needs a role")
		}
		if role == nil {
			// A function call, its output, a reasoning item: the backend
			// renders it into the prompt.
			s.addJSON(it.MarshalTo(nil))
			r.gen.plain = false
			continue
		}
		if role.Type() != fastjson.TypeString {
			return nil, badParam(param+".role", "role must be a string")
		}
		s.messages++
		t, err := r.readContent(it.Get("content"), param+".content", s)
		if err != nil {
			return nil, err
		}
		if first == nil {
			first = t
		}
	}
	return first, nil
}

// readAnthropicMessages reads a Messages request's prompt: system (a
// string or a list of text blocks), then messages, each a role and a
// content that is a string or a list of blocks.
func (r *request) readAnthropicMessages(v *fastjson.Value, s *promptShape) (first []byte, err error) {
	if sys := v.Get("system"); sys != nil && sys.Type() != fastjson.TypeNull {
		s.messages++
		if first, err = r.readContent(sys, "system", s); err != nil {
			return nil, err
		}
	}
	msgs := v.Get("messages")
	if msgs == nil || msgs.Type() != fastjson.TypeArray || len(msgs.GetArray()) == 0 {
		return nil, badParam("messages", "messages must be a non-empty array")
	}
	for i, m := range msgs.GetArray() {
		param := fmt.Sprintf("messages[%d]", i)
		if m.Type() != fastjson.TypeObject {
			return nil, badParam(param, "each message must be an object")
		}
		if dup := jsonscan.Duplicate(m, messageKeys); dup != "" {
			return nil, duplicateKey(param + "." + dup)
		}
		if role := m.Get("role"); role == nil || role.Type() != fastjson.TypeString {
			return nil, badParam(param+".role", "each message needs a role")
		}
		s.messages++
		c := m.Get("content")
		if c == nil || c.Type() == fastjson.TypeNull {
			return nil, badParam(param+".content", "each message needs a content")
		}
		t, err := r.readContent(c, param+".content", s)
		if err != nil {
			return nil, err
		}
		if first == nil {
			first = t
		}
	}
	return first, nil
}

// readContent reads a message's content, a string or a list of parts,
// into s; text is its first text. A part with a text (a string) is that
// text; an image, a file or a document is one image's tokens; any other
// (a tool call or result, thinking) is counted as its JSON.
func (r *request) readContent(c *fastjson.Value, param string, s *promptShape) (text []byte, err error) {
	switch {
	case c == nil || c.Type() == fastjson.TypeNull:
		return nil, nil
	case c.Type() == fastjson.TypeString:
		s.addText(c.GetStringBytes())
		return c.GetStringBytes(), nil
	case c.Type() != fastjson.TypeArray:
		return nil, badParam(param, "content must be a string or an array of parts")
	}
	for j, part := range c.GetArray() {
		pp := param + "[" + strconv.Itoa(j) + "]"
		if part.Type() != fastjson.TypeObject {
			return nil, badParam(pp, "each content part must be an object")
		}
		if dup := jsonscan.Duplicate(part, partKeys); dup != "" {
			return nil, duplicateKey(pp + "." + dup)
		}
		ty := part.Get("type")
		if ty == nil || ty.Type() != fastjson.TypeString {
			return nil, badParam(pp+".type", "each content part needs a type (a string)")
		}
		switch string(ty.GetStringBytes()) {
		case "input_text", "output_text", "text":
			t := part.Get("text")
			if t == nil || t.Type() != fastjson.TypeString {
				return nil, badParam(pp+".text", "a text part needs a text (a string)")
			}
			s.addText(t.GetStringBytes())
			if text == nil {
				text = t.GetStringBytes()
			}
		case "input_image", "input_file", "input_audio", "image", "document":
			s.images++
			r.gen.plain = false
		default:
			s.addJSON(part.MarshalTo(nil))
			r.gen.plain = false
		}
	}
	return text, nil
}

// generationTexts finds, for the backend tokenizer, the prompt of a
// request whose prompt is text messages and function tools, as the chat
// request vLLM renders it from: the instructions or system prompt as a
// system message, then each message, its text parts as chat's; each tool
// as a chat tool (chatTool). A prompt with anything else (images, tool
// calls and results, a built-in tool, a stored conversation) is left to
// the estimate: /tokenize would not count it as the API runs it.
func generationTexts(pp *fastjson.ParserPool, body []byte, r *request) error {
	if !r.gen.plain || r.gen.prior {
		return nil
	}
	p := pp.Get()
	defer pp.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return err
	}
	tools, ok := chatTools(v, r.kind)
	if !ok {
		return nil
	}
	r.onePrompt[0] = promptText{text: chatMessages(v, r.kind), tools: tools}
	r.prompts = r.onePrompt[:]
	return nil
}

// chatMessages is a Responses or Messages request's conversation as
// chat's messages, a JSON array of role and content.
func chatMessages(v *fastjson.Value, kind endpoint) []byte {
	out := []byte{'['}
	add := func(role []byte, content *fastjson.Value) {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = jsonscan.AppendString(append(out, `{"role":`...), string(role))
		out = append(out, `,"content":`...)
		if content.Type() == fastjson.TypeString {
			out = jsonscan.AppendString(out, string(content.GetStringBytes()))
		} else {
			out = append(out, '[')
			for j, part := range content.GetArray() {
				if j > 0 {
					out = append(out, ',')
				}
				out = jsonscan.AppendString(append(out, `{"type":"text","text":`...), string(part.GetStringBytes("text")))
				out = append(out, '}')
			}
			out = append(out, ']')
		}
		out = append(out, '}')
	}
	system := []byte("system")
	if kind == responsesAPI {
		if in := v.Get("instructions"); in != nil && in.Type() == fastjson.TypeString {
			add(system, in)
		}
		in := v.Get("input")
		if in.Type() == fastjson.TypeString {
			add([]byte("user"), in)
		}
		for _, it := range in.GetArray() {
			if c := it.Get("content"); c != nil && c.Type() != fastjson.TypeNull {
				add(it.GetStringBytes("role"), c)
			}
		}
	} else {
		if sys := v.Get("system"); sys != nil && sys.Type() != fastjson.TypeNull {
			add(system, sys)
		}
		for _, m := range v.GetArray("messages") {
			add(m.GetStringBytes("role"), m.Get("content"))
		}
	}
	return append(out, ']')
}

// chatTools is a Responses or Messages request's tools as chat's, a JSON
// array (nil without tools); false when one cannot be told as chat's.
func chatTools(v *fastjson.Value, kind endpoint) ([]byte, bool) {
	tv := v.Get("tools")
	if tv == nil || tv.Type() != fastjson.TypeArray {
		return nil, true
	}
	tools := []byte{'['}
	for i, t := range tv.GetArray() {
		if i > 0 {
			tools = append(tools, ',')
		}
		var ok bool
		if tools, ok = chatTool(tools, t, kind); !ok {
			return nil, false
		}
	}
	return append(tools, ']'), true
}

// chatTool appends a Responses or Messages tool as the chat tool vLLM
// renders it as: {"type":"function","function":{"name", "description",
// "parameters"}}, the parameters a Messages tool's input_schema. ok is
// false for a tool that is no function (a built-in or server tool), which
// no chat tool stands for.
func chatTool(dst []byte, t *fastjson.Value, kind endpoint) (_ []byte, ok bool) {
	params := "parameters"
	if kind == messagesAPI {
		params = "input_schema"
		if ty := t.Get("type"); ty != nil && ty.Type() != fastjson.TypeNull && string(ty.GetStringBytes()) != "custom" {
			return dst, false // bash_20250124, web_search_...: Anthropic's own
		}
	} else if string(t.GetStringBytes("type")) != "function" {
		return dst, false
	}
	name := t.Get("name")
	if name == nil || name.Type() != fastjson.TypeString {
		return dst, false
	}
	dst = append(dst, `{"type":"function","function":{"name":`...)
	dst = name.MarshalTo(dst)
	if d := t.Get("description"); d != nil && d.Type() != fastjson.TypeNull {
		dst = d.MarshalTo(append(dst, `,"description":`...))
	}
	if p := t.Get(params); p != nil && p.Type() != fastjson.TypeNull {
		dst = p.MarshalTo(append(dst, `,"parameters":`...))
	}
	return append(dst, "}}"...), true
}
