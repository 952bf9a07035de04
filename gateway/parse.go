package gateway

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/internal/jsonscan"
)

// endpoint is which OpenAI API a request is for.
type endpoint uint8

const (
	chatCompletions endpoint = iota
	completions
)

func (e endpoint) path() string {
	if e == chatCompletions {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// request is what the gateway reads of a body: only the fields that decide
// admission. Everything else is forwarded untouched.
type request struct {
	kind endpoint
	// numText is badNumber's scratch: the request is on the heap already,
	// a buffer on the stack would not be (fastjson's MarshalTo leaks it).
	numText      [32]byte
	model        string
	stream       bool
	includeUsage bool // the client itself asked for the usage chunk
	maxTokens    int  // 0: absent
	// maxTokensParam is the field maxTokens came from, for errors.
	maxTokensParam string
	// dropMaxCompletion: a /v1/completions body carries
	// max_completion_tokens, which the forwarded body must not.
	dropMaxCompletion bool
	n                 int // choices returned per prompt
	seqs              int // sequences run per prompt: max(n, best_of)
	// pinned: the request sets its own output length — vLLM's ignore_eos
	// (every sequence runs to max_tokens) or a min_tokens floor — so it is
	// sized by its cap, never by a forecast of what the model's answers
	// usually run to.
	pinned bool

	// The prompt, as the estimate tokenizer sees it. A batch completion
	// request has one shape per prompt.
	shapes []promptShape
	// For the backend tokenizer: each prompt as the client wrote it (zero
	// where the prompt is token ids, whose count is exact). Found only when
	// the model counts through its backend (see promptTexts); they point
	// into the body.
	prompts []promptText
	// Affinity keys (affinity.go): the user field and a hash of the
	// prompt's beginning.
	user   string
	prefix uint64

	// oneShape and onePrompt hold shapes and prompts for a request of one
	// prompt, nearly every request, so that reading it allocates less.
	oneShape  [1]promptShape
	onePrompt [1]promptText
}

// parseError is a 400 with the offending parameter.
type parseError struct {
	param string
	msg   string
}

func (e *parseError) Error() string { return e.msg }

func badParam(param, format string, a ...any) *parseError {
	return &parseError{param: param, msg: fmt.Sprintf(format, a...)}
}

// parseRequest reads body with p. The returned request does not refer to
// p's memory (p can be reused at once).
//
// It reads the body as vLLM will (see "One reading of the body" in the
// design): a field that appears twice is refused, since the gateway would
// reserve by one occurrence and the backend (Python's json) serve the last;
// each endpoint's length field is the one its backend generates by; numbers
// are integers as pydantic reads them (10.0 is 10), and one past int64 is a
// 400 naming the field, never a wrapped value.
func parseRequest(p *fastjson.Parser, body []byte, kind endpoint) (*request, error) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, &parseError{msg: fmt.Sprintf("We could not parse the JSON body of your request: %v", err)}
	}
	if v.Type() != fastjson.TypeObject {
		return nil, &parseError{msg: "The request body must be a JSON object."}
	}
	if at, what := badString(body); at >= 0 {
		return nil, &parseError{msg: fmt.Sprintf("We could not parse the JSON body of your request: %s at offset %d", what, at)}
	}
	if dup := duplicate(v, topLevelKeys); dup != "" {
		return nil, duplicateKey(dup)
	}
	r := &request{kind: kind, n: 1, seqs: 1}
	if bad := badNumber(v, r.numText[:0]); bad != "" {
		return nil, &parseError{msg: fmt.Sprintf("We could not parse the JSON body of your request: %q is not a JSON number", bad)}
	}
	mv := v.Get("model")
	if mv == nil || mv.Type() != fastjson.TypeString || len(mv.GetStringBytes()) == 0 {
		return nil, badParam("model", "you must provide a model parameter (a non-empty string)")
	}
	r.model = string(mv.GetStringBytes())

	if sv := v.Get("stream"); sv != nil && sv.Type() != fastjson.TypeNull {
		b, err := sv.Bool()
		if err != nil {
			return nil, badParam("stream", "stream must be a boolean")
		}
		r.stream = b
	}
	if so := v.Get("stream_options"); so != nil && so.Type() != fastjson.TypeNull {
		if so.Type() != fastjson.TypeObject {
			return nil, badParam("stream_options", "stream_options must be an object")
		}
		if dup := duplicate(so, streamOptionKeys); dup != "" {
			return nil, duplicateKey("stream_options." + dup)
		}
		// vLLM's StreamOptions.include_usage defaults to true: an object
		// without it asks for the usage chunk.
		r.includeUsage = true
		if iu := so.Get("include_usage"); iu != nil {
			r.includeUsage = false
			if iu.Type() != fastjson.TypeNull {
				b, err := iu.Bool()
				if err != nil {
					return nil, badParam("stream_options.include_usage", "include_usage must be a boolean")
				}
				r.includeUsage = b
			}
		}
	}
	// Chat generates max_completion_tokens, else max_tokens (vLLM:
	// `max_completion_tokens or max_tokens`). /v1/completions has only
	// max_tokens; a max_completion_tokens there is dropped from the
	// forwarded body (dropMaxCompletion), so that no backend version can
	// generate by a field the reservation did not count.
	keys := []string{"max_completion_tokens", "max_tokens"}
	if kind == completions {
		keys = keys[1:]
		if mc := v.Get("max_completion_tokens"); mc != nil {
			r.dropMaxCompletion = true
		}
	}
	for _, key := range keys {
		mt := v.Get(key)
		if mt == nil || mt.Type() == fastjson.TypeNull {
			continue
		}
		n, err := intParam(mt, key)
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return nil, badParam(key, "%s must be a positive integer, got %d", key, n)
		}
		if n > math.MaxInt {
			return nil, badParam(key, "%s is out of range: %d", key, n)
		}
		r.maxTokens, r.maxTokensParam = int(n), key
		break
	}
	if nv := v.Get("n"); nv != nil && nv.Type() != fastjson.TypeNull {
		n, err := intParam(nv, "n")
		if err != nil || n < 1 || n > 128 {
			return nil, badParam("n", "n must be an integer between 1 and 128")
		}
		r.n = int(n)
	}
	if err := r.readPinned(v); err != nil {
		return nil, err
	}
	r.seqs = r.n
	if best := v.Get("best_of"); best != nil && best.Type() != fastjson.TypeNull {
		b, err := intParam(best, "best_of")
		if err != nil || b < 1 || b > 128 {
			return nil, badParam("best_of", "best_of must be an integer between 1 and 128")
		}
		r.seqs = max(r.n, int(b)) // vLLM runs best_of sequences and returns n
	}

	if kind == chatCompletions {
		err = r.readMessages(v)
	} else {
		err = r.readPrompt(v)
	}
	if err != nil {
		return nil, err
	}
	r.readAffinity(v)
	return r, nil
}

// readPinned reads the vLLM fields that set the output's length:
// ignore_eos (a boolean) and min_tokens (an integer >= 0, at most the
// request's max tokens), as vLLM's SamplingParams validates them.
func (r *request) readPinned(v *fastjson.Value) error {
	if ie := v.Get("ignore_eos"); ie != nil && ie.Type() != fastjson.TypeNull {
		b, err := ie.Bool()
		if err != nil {
			return badParam("ignore_eos", "ignore_eos must be a boolean")
		}
		r.pinned = b
	}
	mt := v.Get("min_tokens")
	if mt == nil || mt.Type() == fastjson.TypeNull {
		return nil
	}
	n, err := intParam(mt, "min_tokens")
	if err != nil {
		return err
	}
	switch {
	case n < 0:
		return badParam("min_tokens", "min_tokens must be greater than or equal to 0, got %d.", n)
	case r.maxTokens > 0 && n > int64(r.maxTokens):
		return badParam("min_tokens", "min_tokens must be less than or equal to %s=%d, got %d.", r.maxTokensParam, r.maxTokens, n)
	}
	r.pinned = r.pinned || n > 0
	return nil
}

// outOfRange refuses a length no request to a model of maxLen tokens could
// be served with: more output than the whole context. (One that merely
// does not fit beside its prompt is context_length_exceeded, from the
// reservation.)
func (r *request) outOfRange(maxLen int) *apiError {
	if r.maxTokens <= maxLen {
		return nil
	}
	return &apiError{status: 400, typ: typeInvalidRequest, code: "context_length_exceeded", param: r.maxTokensParam,
		message: fmt.Sprintf("%s is too large: %d. This model's maximum context length is %d tokens.", r.maxTokensParam, r.maxTokens, maxLen)}
}

// The keys the gateway reads, per object: a duplicate of one of them would
// let the gateway and the backend read different requests.
var (
	topLevelKeys     = []string{"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n", "best_of", "stream", "stream_options", "tools", "min_tokens", "ignore_eos"}
	streamOptionKeys = []string{"include_usage"}
	messageKeys      = []string{"role", "content", "tool_calls"}
	partKeys         = []string{"type", "text"}
)

// duplicate is the first of keys that appears more than once in the
// object v ("" if none, or if v is not an object).
func duplicate(v *fastjson.Value, keys []string) string {
	o, err := v.Object()
	if err != nil {
		return ""
	}
	var seen uint64 // bit i: keys[i] met
	var dup string
	o.Visit(func(k []byte, _ *fastjson.Value) {
		if dup != "" {
			return
		}
		for i, want := range keys {
			if string(k) == want {
				if seen&(1<<i) != 0 {
					dup = want
				}
				seen |= 1 << i
				return
			}
		}
	})
	return dup
}

// duplicateKey refuses a body in which the key at path appears twice.
func duplicateKey(path string) error {
	return badParam(path, "duplicate key %q: give each field once (JSON parsers disagree on which occurrence counts)", path)
}

// intParam reads an integer parameter the way pydantic does: a JSON integer,
// or a number with no fractional part (10.0, 1e3). A value past int64 is out
// of range, not wrapped.
func intParam(v *fastjson.Value, name string) (int64, error) {
	if v.Type() != fastjson.TypeNumber {
		return 0, badParam(name, "%s must be an integer", name)
	}
	if n, err := v.Int64(); err == nil { // a plain integer within int64
		return n, nil
	}
	raw := string(v.MarshalTo(nil))
	n, err := strconv.ParseInt(raw, 10, 64)
	if err == nil {
		return n, nil
	}
	if errors.Is(err, strconv.ErrRange) {
		return 0, badParam(name, "%s is out of range: %s", name, raw)
	}
	f, err := strconv.ParseFloat(raw, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) || math.IsNaN(f) || f != math.Trunc(f) {
		return 0, badParam(name, "%s must be an integer, got %s", name, raw)
	}
	// 2^63 is exactly representable; anything at or past it is not an int64.
	if f >= 1<<63 || f < -(1<<63) {
		return 0, badParam(name, "%s is out of range: %s", name, raw)
	}
	return int64(f), nil
}

func (r *request) readMessages(v *fastjson.Value) error {
	msgs := v.Get("messages")
	if msgs == nil || msgs.Type() != fastjson.TypeArray {
		return badParam("messages", "messages must be a non-empty array")
	}
	arr, _ := msgs.Array()
	if len(arr) == 0 {
		return badParam("messages", "messages must be a non-empty array")
	}
	var s promptShape
	s.messages = len(arr)
	for i, m := range arr {
		if m.Type() != fastjson.TypeObject {
			return badParam(fmt.Sprintf("messages[%d]", i), "each message must be an object")
		}
		if dup := duplicate(m, messageKeys); dup != "" {
			return duplicateKey(fmt.Sprintf("messages[%d].%s", i, dup))
		}
		if role := m.Get("role"); role == nil || role.Type() != fastjson.TypeString {
			return badParam(fmt.Sprintf("messages[%d].role", i), "each message needs a role")
		}
		switch c := m.Get("content"); {
		case c == nil || c.Type() == fastjson.TypeNull:
			// an assistant message with tool calls only
		case c.Type() == fastjson.TypeString:
			s.textBytes += len(c.GetStringBytes())
		case c.Type() == fastjson.TypeArray:
			parts, _ := c.Array()
			for j, part := range parts {
				if dup := duplicate(part, partKeys); dup != "" {
					return duplicateKey(fmt.Sprintf("messages[%d].content[%d].%s", i, j, dup))
				}
				if t := part.GetStringBytes("text"); t != nil {
					s.textBytes += len(t)
				} else {
					s.images++
				}
			}
		default:
			return badParam(fmt.Sprintf("messages[%d].content", i), "content must be a string or an array of parts")
		}
		// Tool calls and names are prompt text too.
		if tc := m.Get("tool_calls"); tc != nil {
			s.textBytes += len(tc.MarshalTo(nil))
		}
	}
	if tools := v.Get("tools"); tools != nil && tools.Type() != fastjson.TypeNull {
		s.textBytes += len(tools.MarshalTo(nil))
	}
	r.oneShape[0] = s
	r.shapes = r.oneShape[:]
	return nil
}

func (r *request) readPrompt(v *fastjson.Value) error {
	p := v.Get("prompt")
	if p == nil || p.Type() == fastjson.TypeNull {
		return badParam("prompt", "you must provide a prompt")
	}
	r.shapes = r.oneShape[:0] // grown past one prompt by append
	switch p.Type() {
	case fastjson.TypeString:
		r.shapes = append(r.shapes, promptShape{textBytes: len(p.GetStringBytes())})
	case fastjson.TypeArray:
		items, _ := p.Array()
		if len(items) == 0 {
			return badParam("prompt", "prompt must not be empty")
		}
		switch items[0].Type() {
		case fastjson.TypeNumber: // one prompt of token ids
			r.shapes = append(r.shapes, promptShape{tokenIDs: len(items), ids: true})
		case fastjson.TypeString: // a batch of text prompts
			for i, it := range items {
				if it.Type() != fastjson.TypeString {
					return badParam(fmt.Sprintf("prompt[%d]", i), "a batch of prompts must all be strings")
				}
				r.shapes = append(r.shapes, promptShape{textBytes: len(it.GetStringBytes())})
			}
		case fastjson.TypeArray: // a batch of token-id prompts
			for i, it := range items {
				ids, err := it.Array()
				if err != nil || len(ids) == 0 {
					return badParam(fmt.Sprintf("prompt[%d]", i), "each prompt of token ids must be a non-empty array")
				}
				r.shapes = append(r.shapes, promptShape{tokenIDs: len(ids), ids: true})
			}
		default:
			return badParam("prompt", "prompt must be a string, an array of strings, or token ids")
		}
	default:
		return badParam("prompt", "prompt must be a string, an array of strings, or token ids")
	}
	if len(r.shapes) > 256 {
		return badParam("prompt", "at most 256 prompts in one request")
	}
	return nil
}

// promptText is one prompt as the client wrote it: a chat's messages and
// tools (nil when absent or null), or one prompt string of a completion
// (in text). It is what the backend's count depends on (with the model and
// the endpoint), so it keys the tokenize cache as it is, and a /tokenize
// body is built from it only when the cache cannot answer.
type promptText struct{ text, tools []byte }

var (
	chatPromptKeys       = []string{"messages", "tools"}
	completionPromptKeys = []string{"prompt"}
)

// promptTexts finds r.prompts in body (already parsed once into r) by
// scanning its bytes. A body the scan cannot read as the parser did (a
// top-level key written with escapes) is read from a parse tree instead,
// its prompts marshalled from it.
func promptTexts(pp *fastjson.ParserPool, body []byte, r *request) error {
	keys := chatPromptKeys
	if r.kind == completions {
		keys = completionPromptKeys
	}
	var found [2][]byte
	if err := jsonscan.Lookup(body, keys, found[:len(keys)]); err != nil {
		p := pp.Get()
		defer pp.Put(p)
		return r.promptTextsFromTree(p, body)
	}
	if r.kind == chatCompletions {
		tools := found[1]
		if string(tools) == "null" {
			tools = nil
		}
		r.onePrompt[0] = promptText{text: found[0], tools: tools}
		r.prompts = r.onePrompt[:]
		return nil
	}
	if len(r.shapes) == 1 {
		r.onePrompt[0] = promptText{}
		r.prompts = r.onePrompt[:]
	} else {
		r.prompts = make([]promptText, len(r.shapes))
	}
	prompt := found[0]
	if len(prompt) > 0 && prompt[0] == '"' {
		r.prompts[0].text = prompt
		return nil
	}
	i := 0
	return jsonscan.Elements(prompt, func(v []byte) {
		if i < len(r.shapes) && !r.shapes[i].ids {
			r.prompts[i].text = v
		}
		i++
	})
}

// promptTextsFromTree is promptTexts for a body only a parser reads right.
func (r *request) promptTextsFromTree(p *fastjson.Parser, body []byte) error {
	v, err := p.ParseBytes(body)
	if err != nil {
		return err
	}
	if r.kind == chatCompletions {
		var pt promptText
		pt.text = v.Get("messages").MarshalTo(nil)
		if tools := v.Get("tools"); tools != nil && tools.Type() != fastjson.TypeNull {
			pt.tools = tools.MarshalTo(nil)
		}
		r.prompts = []promptText{pt}
		return nil
	}
	prompt := v.Get("prompt")
	items := []*fastjson.Value{prompt}
	if prompt.Type() == fastjson.TypeArray {
		items, _ = prompt.Array()
	}
	r.prompts = make([]promptText, len(r.shapes))
	for i, sh := range r.shapes {
		if !sh.ids {
			// fastjson unescapes a string it was asked the type of, and
			// would quote it again the Go way: re-quoted here with JSON's
			// escapes.
			r.prompts[i].text = appendJSONString(nil, string(items[i].GetStringBytes()))
		}
	}
	return nil
}

// tokenizeBody appends to dst the vLLM /tokenize request for prompt i of
// r: the prompt exactly as the client sent it, so the backend counts what
// it will run.
func tokenizeBody(dst []byte, r *request, i int) []byte {
	dst = appendJSONString(append(dst, `{"model":`...), r.model)
	pt := r.prompts[i]
	if r.kind == completions {
		dst = append(append(dst, `,"prompt":`...), pt.text...)
		return append(dst, '}')
	}
	dst = append(append(dst, `,"add_generation_prompt":true,"messages":`...), pt.text...)
	if pt.tools != nil {
		dst = append(append(dst, `,"tools":`...), pt.tools...)
	}
	return append(dst, '}')
}

// appendJSONString appends s as a JSON string. fastjson quotes a string with
// special characters by strconv.AppendQuote, whose \x00, \a and \U escapes
// are Go, not JSON; this writes JSON's escapes only, and invalid UTF-8 as
// U+FFFD, as encoding/json does.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	done := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(append(dst, s[done:i]...), `\ufffd`...)
				done = i + 1
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[done:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		done = i
	}
	return append(append(dst, s[done:]...), '"')
}

// badString returns the offset of the first byte inside a string of the JSON
// text body that JSON forbids there — a control character (below U+0020)
// written raw, or a backslash that starts no valid escape — with what is
// wrong, or -1. Python's json, which reads the body for vLLM, refuses both;
// fastjson lets them through, and a string copied from the body into a
// /tokenize body or a rewritten one would carry them into invalid JSON.
//
// body has been parsed by fastjson, so every backslash in it is inside a
// string, and so is every control character but JSON's whitespace: the
// escapes are checked by jumping from backslash to backslash, and only a
// body with a tab, newline or carriage return (pretty-printed JSON) is
// walked string by string.
func badString(body []byte) (int, string) {
	for j := 0; ; {
		k := bytes.IndexByte(body[j:], '\\')
		if k < 0 {
			break
		}
		i := j + k
		n := escapeLen(body[i+1:])
		if n == 0 {
			return i, "invalid escape sequence in a string"
		}
		j = i + 1 + n
	}
	if !hasControl(body) {
		return -1, ""
	}
	in := false
	for i := 0; i < len(body); i++ {
		switch c := body[i]; {
		case c == '"':
			in = !in
		case !in:
		case c < 0x20:
			return i, fmt.Sprintf("control character U+%04X inside a string (write it as \\u%04x)", c, c)
		case c == '\\':
			i++
		}
	}
	return -1, ""
}

// badNumber returns the text of the first number in v that JSON's grammar
// refuses, or "". fastjson takes any run of digits, signs, dots and
// exponents for a number, and inf and nan too: 00, 1-2, +1, .5 or nan
// parse. Python's json, which reads the body for vLLM, refuses them, and a
// body the gateway accepted must not come back as the backend's error
// after its KV was reserved. The walk is over the parse tree, not the
// body: a long prompt is one string, which costs nothing here. Overlong
// text is cut for the message. scratch holds each number's text in turn.
func badNumber(v *fastjson.Value, scratch []byte) string {
	switch v.Type() {
	case fastjson.TypeNumber:
		if raw := v.MarshalTo(scratch[:0]); !jsonNumber(raw) {
			if len(raw) > 24 {
				return string(raw[:24]) + "…"
			}
			return string(raw)
		}
	case fastjson.TypeArray:
		a, _ := v.Array()
		for _, e := range a {
			if bad := badNumber(e, scratch); bad != "" {
				return bad
			}
		}
	case fastjson.TypeObject:
		o, _ := v.Object()
		var bad string
		o.Visit(func(_ []byte, e *fastjson.Value) {
			if bad == "" {
				bad = badNumber(e, scratch)
			}
		})
		return bad
	}
	return ""
}

// jsonNumber reports whether b is a number by JSON's grammar:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func jsonNumber(b []byte) bool {
	i := 0
	digits := func() int {
		n := 0
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch n := digits(); {
	case n == 0:
		return false
	case n > 1 && b[i-n] == '0':
		return false // a leading zero
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

// escapeLen is the length of the escape that esc, what follows a
// backslash, starts (1, or 5 for \uXXXX), or 0 if it is none of JSON's.
func escapeLen(esc []byte) int {
	if len(esc) == 0 {
		return 0
	}
	switch esc[0] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 1
	case 'u':
		if len(esc) < 5 {
			return 0
		}
		for _, h := range esc[1:5] {
			if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
				return 0
			}
		}
		return 5
	}
	return 0
}

// hasControl reports whether b holds any byte below 0x20, 32 bytes at a
// time: most bodies (compact JSON from the SDKs) have none and pay only
// this, which on a 4k-token prompt is most of the cost of checking its
// strings. A word's bytes below 0x20 are those whose high bit
// (x - 0x20…) &^ x sets (a borrow can only spread from a byte that is
// below 0x20 itself); four words are tested at once, so that their
// arithmetic overlaps.
func hasControl(b []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	const lo = ones * 0x20
	i := 0
	for ; i+32 <= len(b); i += 32 {
		w := b[i : i+32 : i+32]
		x0 := binary.LittleEndian.Uint64(w)
		x1 := binary.LittleEndian.Uint64(w[8:])
		x2 := binary.LittleEndian.Uint64(w[16:])
		x3 := binary.LittleEndian.Uint64(w[24:])
		if ((x0-lo)&^x0|(x1-lo)&^x1|(x2-lo)&^x2|(x3-lo)&^x3)&highs != 0 {
			return true
		}
	}
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		if (x-lo)&^x&highs != 0 {
			return true
		}
	}
	for ; i < len(b); i++ {
		if b[i] < 0x20 {
			return true
		}
	}
	return false
}

// rewriteBody returns body with what the gateway must add or remove: with
// usage, stream_options.include_usage (so it learns the real token counts
// of a stream); with maxTokens > 0, max_tokens (the model's
// default_max_tokens, which the reservation assumed); with dropMaxCompletion,
// no max_completion_tokens (a /v1/completions body, whose reservation
// followed max_tokens). Members are added after the opening brace and
// removed by their bytes; every other byte stays as the client sent it (a
// re-serialised body would re-quote keys, and fastjson's quoting is not
// always JSON's). body is one parseRequest accepted: it is read by a scan,
// not parsed again.
func rewriteBody(body []byte, usage bool, maxTokens int, dropMaxCompletion bool, model string) ([]byte, error) {
	drop := func(name []byte) bool {
		return (usage && keyIs(name, "stream_options")) || (model != "" && keyIs(name, "model")) ||
			(maxTokens > 0 && keyIs(name, "max_tokens")) ||
			((maxTokens > 0 || dropMaxCompletion) && keyIs(name, "max_completion_tokens"))
	}
	// One pass over the members: the spans kept, and the stream options
	// (an object or null: parseRequest refused anything else).
	var keptBuf [16][2]int // a request has a few members: no allocation for their spans
	kept := keptBuf[:0]
	var so []byte
	if err := jsonscan.Members(body, func(name []byte, start, value, end int) bool {
		if !drop(name) {
			kept = append(kept, [2]int{start, end})
		} else if usage && so == nil && keyIs(name, "stream_options") {
			so = body[value:end]
		}
		return true
	}); err != nil {
		return nil, err
	}
	var addBuf [128]byte // the members added, before they are copied into out
	add := addBuf[:0]
	if usage {
		add = append(add, `"stream_options":{"include_usage":true`...)
		if len(so) > 0 && so[0] == '{' {
			// Keep the client's other stream options (continuous usage
			// stats, ...).
			if err := jsonscan.Members(so, func(name []byte, start, _, end int) bool {
				if !keyIs(name, "include_usage") {
					add = append(append(add, ','), so[start:end]...)
				}
				return true
			}); err != nil {
				return nil, fmt.Errorf("stream_options: %w", err)
			}
		}
		add = append(add, "},"...)
	}
	if maxTokens > 0 {
		add = append(strconv.AppendInt(append(add, `"max_tokens":`...), int64(maxTokens), 10), ',')
	}
	if model != "" {
		add = append(appendJSONString(append(add, `"model":`...), model), ',')
	}
	open := bytes.IndexByte(body, '{')
	out := append(append(make([]byte, 0, len(body)+len(add)), body[:open+1]...), add...)
	for k, m := range kept {
		if k > 0 {
			out = append(out, ',')
		}
		out = append(out, body[m[0]:m[1]]...)
	}
	if len(kept) == 0 && len(add) > 0 {
		out = out[:len(out)-1] // the added members' trailing comma
	}
	return append(out, '}'), nil
}

// keyIs reports whether a key, as written between its quotes, names want:
// a key spelled with escapes (max\u005ftokens) is the same key to the
// backend's parser.
func keyIs(raw []byte, want string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == want
	}
	var k string
	return json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &k) == nil && k == want
}
