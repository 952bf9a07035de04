package gateway

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strconv"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/internal/jsonscan"
)

// request is what the gateway reads of a body: only the fields that decide
// admission. Everything else is forwarded untouched.
type request struct {
	kind endpoint
	// numText is jsonscan.InvalidNumber's scratch: the request is on the
	// heap already, a buffer on the stack would not be (fastjson's MarshalTo
	// leaks it).
	numText      [32]byte
	model        string
	stream       bool
	includeUsage bool // the client itself asked for the usage chunk
	// continuousUsage: the client itself asked for usage on every chunk
	// (vLLM's stream_options.continuous_usage_stats, with include_usage).
	continuousUsage bool
	maxTokens       int // 0: absent
	// maxTokensParam is the field maxTokens came from, for errors.
	maxTokensParam string
	// dropMaxCompletion: a /v1/completions body carries
	// max_completion_tokens, which the forwarded body must not.
	dropMaxCompletion bool
	// alias is the model's served_name the client sent ("" when it sent
	// the model's own name): the backend is sent model, the client sees
	// alias in answers; renames are the patterns renameModel swaps.
	alias   string
	renames [][2][]byte
	n       int // choices returned per prompt
	seqs    int // sequences run per prompt: max(n, best_of)
	// pinned: the request sets its own output length — vLLM's ignore_eos
	// (every sequence runs to max_tokens) or a min_tokens floor — so it is
	// sized by its cap, never by a forecast of what the model's answers
	// usually run to.
	pinned bool
	// cacheSalt is vLLM's cache_salt: requests with different salts never
	// share prompt blocks on the backend.
	cacheSalt string
	// resumable: a stream the guard stops can be continued from the text
	// it generated (resume.go).
	resumable bool
	// tools: the request offers tools (and does not rule them out), so
	// its answer may turn into a tool call, which cannot be resumed.
	tools bool

	// The prompt, as the estimate tokenizer sees it. A batch completion
	// request has one shape per prompt.
	shapes []promptShape
	// For the backend tokenizer: each prompt as the client wrote it (zero
	// where the prompt is token ids, whose count is exact). Found only when
	// the model counts through its backend (see promptTexts); they point
	// into the body.
	prompts []promptText
	// Affinity keys (prefix.go): the user field and a hash of the
	// prompt's beginning.
	user   string
	prefix uint64

	// oneShape and onePrompt hold shapes and prompts for a request of one
	// prompt, nearly every request, so that reading it allocates less.
	oneShape  [1]promptShape
	onePrompt [1]promptText

	pool poolingInputs    // a pooling request's own fields (parse_pooling.go)
	gen  generationInputs // a Responses or Messages request's (parse_generation.go)
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
	v, r, err := openBody(p, body, kind, topLevelKeys)
	if err != nil {
		return nil, err
	}

	if err := r.readStream(v); err != nil {
		return nil, err
	}
	if err := r.readStreamOptions(v); err != nil {
		return nil, err
	}
	if err := r.readLength(v, kind); err != nil {
		return nil, err
	}
	if err := r.readSequences(v); err != nil {
		return nil, err
	}
	if err := r.readPinned(v); err != nil {
		return nil, err
	}
	if err := r.readCacheSalt(v); err != nil {
		return nil, err
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
	r.resumable = r.stream && r.seqs == 1 && len(r.shapes) == 1 && continuable(v, kind)
	if t := v.Get("tools"); r.stream && t != nil && len(t.GetArray()) > 0 {
		r.tools = string(v.GetStringBytes("tool_choice")) != "none"
	}
	return r, nil
}

// readStreamOptions reads stream_options: whether the client asked for
// the usage chunk, and for usage on every chunk.
func (r *request) readStreamOptions(v *fastjson.Value) error {
	so := v.Get("stream_options")
	if so == nil || so.Type() == fastjson.TypeNull {
		return nil
	}
	if so.Type() != fastjson.TypeObject {
		return badParam("stream_options", "stream_options must be an object")
	}
	if dup := jsonscan.Duplicate(so, streamOptionKeys); dup != "" {
		return duplicateKey("stream_options." + dup)
	}
	// vLLM's StreamOptions.include_usage defaults to true: an object
	// without it asks for the usage chunk.
	r.includeUsage = true
	if iu := so.Get("include_usage"); iu != nil {
		r.includeUsage = false
		if iu.Type() != fastjson.TypeNull {
			b, err := iu.Bool()
			if err != nil {
				return badParam("stream_options.include_usage", "include_usage must be a boolean")
			}
			r.includeUsage = b
		}
	}
	if cu := so.Get("continuous_usage_stats"); cu != nil && cu.Type() != fastjson.TypeNull {
		b, err := cu.Bool()
		if err != nil {
			return badParam("stream_options.continuous_usage_stats", "continuous_usage_stats must be a boolean")
		}
		r.continuousUsage = b && r.includeUsage
	}
	return nil
}

// readLength reads the length field a chat or completion generates by.
// Chat generates max_completion_tokens, else max_tokens (vLLM:
// `max_completion_tokens or max_tokens`). /v1/completions has only
// max_tokens; a max_completion_tokens there is dropped from the
// forwarded body (dropMaxCompletion), so that no backend version can
// generate by a field the reservation did not count.
func (r *request) readLength(v *fastjson.Value, kind endpoint) error {
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
		n, err := lengthParam(mt, key)
		if err != nil {
			return err
		}
		r.maxTokens, r.maxTokensParam = n, key
		return nil
	}
	return nil
}

// readSequences reads n and best_of: the choices returned per prompt,
// and the sequences run for them.
func (r *request) readSequences(v *fastjson.Value) error {
	if nv := v.Get("n"); nv != nil && nv.Type() != fastjson.TypeNull {
		n, err := intParam(nv, "n")
		if err != nil || n < 1 || n > 128 {
			return badParam("n", "n must be an integer between 1 and 128")
		}
		r.n = int(n)
	}
	r.seqs = r.n
	if best := v.Get("best_of"); best != nil && best.Type() != fastjson.TypeNull {
		b, err := intParam(best, "best_of")
		if err != nil || b < 1 || b > 128 {
			return badParam("best_of", "best_of must be an integer between 1 and 128")
		}
		r.seqs = max(r.n, int(b)) // vLLM runs best_of sequences and returns n
	}
	return nil
}

// readCacheSalt reads cache_salt, which names the request's prompt
// blocks apart from other salts' (prefix.go).
func (r *request) readCacheSalt(v *fastjson.Value) error {
	cs := v.Get("cache_salt")
	if cs == nil || cs.Type() == fastjson.TypeNull {
		return nil
	}
	b, err := cs.StringBytes()
	if err != nil || len(b) == 0 {
		return badParam("cache_salt", "cache_salt must be a non-empty string")
	}
	r.cacheSalt = string(b)
	return nil
}

// readStream reads stream: a boolean, null as absent.
func (r *request) readStream(v *fastjson.Value) error {
	sv := v.Get("stream")
	if sv == nil || sv.Type() == fastjson.TypeNull {
		return nil
	}
	b, err := sv.Bool()
	if err != nil {
		return badParam("stream", "stream must be a boolean")
	}
	r.stream = b
	return nil
}

// lengthParam reads a length field (max_tokens and its kin): a positive
// integer an int holds.
func lengthParam(v *fastjson.Value, key string) (int, error) {
	n, err := intParam(v, key)
	if err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, badParam(key, "%s must be a positive integer, got %d", key, n)
	}
	if n > math.MaxInt {
		return 0, badParam(key, "%s is out of range: %d", key, n)
	}
	return int(n), nil
}

// openBody is the reading every admitted body starts with: JSON, an
// object, valid strings, none of keys twice, numbers that are numbers, a
// model named. It returns the parsed body and the request it fills.
func openBody(p *fastjson.Parser, body []byte, kind endpoint, keys []string) (*fastjson.Value, *request, error) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, nil, &parseError{msg: fmt.Sprintf("We could not parse the JSON body of your request: %v", err)}
	}
	if v.Type() != fastjson.TypeObject {
		return nil, nil, &parseError{msg: "The request body must be a JSON object."}
	}
	if at, what := jsonscan.InvalidString(body); at >= 0 {
		return nil, nil, &parseError{msg: fmt.Sprintf("We could not parse the JSON body of your request: %s at offset %d", what, at)}
	}
	if dup := jsonscan.Duplicate(v, keys); dup != "" {
		return nil, nil, duplicateKey(dup)
	}
	r := &request{kind: kind, n: 1, seqs: 1}
	if bad := jsonscan.InvalidNumber(v, r.numText[:0]); bad != "" {
		return nil, nil, &parseError{msg: fmt.Sprintf("We could not parse the JSON body of your request: %q is not a JSON number", bad)}
	}
	mv := v.Get("model")
	if mv == nil || mv.Type() != fastjson.TypeString || len(mv.GetStringBytes()) == 0 {
		return nil, nil, badParam("model", "you must provide a model parameter (a non-empty string)")
	}
	r.model = string(mv.GetStringBytes())
	return v, r, nil
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
	topLevelKeys     = []string{"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n", "best_of", "stream", "stream_options", "tools", "min_tokens", "ignore_eos", "cache_salt"}
	streamOptionKeys = []string{"include_usage", "continuous_usage_stats"}
	messageKeys      = []string{"role", "content", "tool_calls"}
	partKeys         = []string{"type", "text"}
)

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
		if dup := jsonscan.Duplicate(m, messageKeys); dup != "" {
			return duplicateKey(fmt.Sprintf("messages[%d].%s", i, dup))
		}
		if role := m.Get("role"); role == nil || role.Type() != fastjson.TypeString {
			return badParam(fmt.Sprintf("messages[%d].role", i), "each message needs a role")
		}
		switch c := m.Get("content"); {
		case c == nil || c.Type() == fastjson.TypeNull:
			// an assistant message with tool calls only
		case c.Type() == fastjson.TypeString:
			s.addText(c.GetStringBytes())
		case c.Type() == fastjson.TypeArray:
			parts, _ := c.Array()
			for j, part := range parts {
				if dup := jsonscan.Duplicate(part, partKeys); dup != "" {
					return duplicateKey(fmt.Sprintf("messages[%d].content[%d].%s", i, j, dup))
				}
				if t := part.GetStringBytes("text"); t != nil {
					s.addText(t)
				} else {
					s.images++
				}
			}
		default:
			return badParam(fmt.Sprintf("messages[%d].content", i), "content must be a string or an array of parts")
		}
		// Tool calls and names are prompt text too.
		if tc := m.Get("tool_calls"); tc != nil {
			s.addJSON(tc.MarshalTo(nil))
		}
	}
	if tools := v.Get("tools"); tools != nil && tools.Type() != fastjson.TypeNull {
		s.addJSON(tools.MarshalTo(nil))
		s.tools = len(tools.GetArray())
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
		r.shapes = append(r.shapes, textShape(p.GetStringBytes()))
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
				r.shapes = append(r.shapes, textShape(it.GetStringBytes()))
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

// readAffinity notes what of body keys its affinity without a session:
// the user field, and a hash of the first affinityPrefix bytes of the
// first message's text or the first prompt.
func (r *request) readAffinity(v *fastjson.Value) {
	if u := v.Get("user"); u != nil && u.Type() == fastjson.TypeString {
		r.user = string(u.GetStringBytes())
	}
	var text []byte
	if r.kind == chatCompletions {
		if msgs := v.GetArray("messages"); len(msgs) > 0 {
			if c := msgs[0].Get("content"); c != nil && c.Type() == fastjson.TypeString {
				text = c.GetStringBytes()
			}
		}
	} else if p := v.Get("prompt"); p != nil {
		switch p.Type() {
		case fastjson.TypeString:
			text = p.GetStringBytes()
		case fastjson.TypeArray:
			if items := p.GetArray(); len(items) > 0 && items[0].Type() == fastjson.TypeString {
				text = items[0].GetStringBytes()
			}
		}
	}
	if len(text) > 0 {
		r.prefix = maphash.Bytes(affinitySeed, text[:min(len(text), affinityPrefix)]) | 1
	}
}

// continuable says whether a request's body can be continued from its
// text (resume.go says what cannot be): read with the rest of the body.
func continuable(v *fastjson.Value, kind endpoint) bool {
	for _, k := range structuredKeys {
		if f := v.Get(k); f != nil && f.Type() != fastjson.TypeNull {
			return false
		}
	}
	if rf := v.Get("response_format"); rf != nil && rf.Type() == fastjson.TypeObject && string(rf.GetStringBytes("type")) != "text" {
		return false
	}
	if kind == chatCompletions {
		// vLLM's chat echo repeats the last message before the answer: a
		// continuation, whose last message is the text generated, would
		// repeat that text.
		return !isTrue(v.Get("continue_final_message")) && !isFalse(v.Get("add_generation_prompt")) && !isTrue(v.Get("echo"))
	}
	p := v.Get("prompt")
	return p != nil && p.Type() == fastjson.TypeString && !isTrue(v.Get("echo")) && v.Get("suffix") == nil
}

// structuredKeys are vLLM's fields that constrain the output to a grammar,
// which a continuation would restart from its beginning.
var structuredKeys = [...]string{"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"}

func isTrue(v *fastjson.Value) bool { return v != nil && v.Type() == fastjson.TypeTrue }

func isFalse(v *fastjson.Value) bool { return v != nil && v.Type() == fastjson.TypeFalse }
