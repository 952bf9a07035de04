package sim

import (
	"bytes"
	"encoding/json"
	"math"

	"github.com/valyala/fastjson"
)

// genParams is what the engine needs of a completion request. Parsing reads
// only the fields below and ignores the rest (sampling parameters, stop,
// logprobs, tools, ...), as a simulator that does not sample may.
type genParams struct {
	chat         bool
	promptTokens int
	maxTokens    int // resolved: max_model_len − prompt when not given
	minTokens    int
	n            int
	stream       bool
	includeUsage bool
	// continuousUsage: usage on every chunk (continuous_usage_stats, with
	// include_usage, on a server that honours it).
	continuousUsage bool
	ignoreEOS       bool
	key             uint64      // seed and content: what the output is drawn from
	lengths         *lengthDist // what its lengths are drawn from (Config.OutputLenWhen); nil: OutputLen
	// The prompt's full-block hashes for the prefix cache; off when it is
	// off. cache_salt changes them all, never the output.
	blocks blockHasher
}

// parseGenRequest validates a /v1/chat/completions (chat) or /v1/completions
// body the way vLLM does, in vLLM's order: JSON and field types, then the
// model (404), then the context length, then the sampling limits. It touches
// nothing outside p, so a rejected request leaves nothing behind.
func parseGenRequest(p *fastjson.Parser, body []byte, chat bool, s *settings) (genParams, *apiError) {
	g := genParams{chat: chat, n: 1}
	v, err := p.ParseBytes(body)
	if err != nil {
		return g, badRequest("", "JSON decode error: %v", err)
	}
	if v.Type() != fastjson.TypeObject {
		return g, badRequest("", "Input should be a valid dictionary or object to extract fields from")
	}
	model, aerr := optString(v, "model")
	if aerr != nil {
		return g, aerr
	}
	var maxTokens, maxCompletion, n, minTokens, seed optInt
	for _, f := range []struct {
		name string
		dst  *optInt
	}{{"max_tokens", &maxTokens}, {"n", &n}, {"min_tokens", &minTokens}, {"seed", &seed}} {
		if *f.dst, aerr = getInt(v, f.name); aerr != nil {
			return g, aerr
		}
	}
	if chat {
		if maxCompletion, aerr = getInt(v, "max_completion_tokens"); aerr != nil {
			return g, aerr
		}
	}
	if g.stream, aerr = getBool(v, "stream", false); aerr != nil {
		return g, aerr
	}
	if g.ignoreEOS, aerr = getBool(v, "ignore_eos", false); aerr != nil {
		return g, aerr
	}
	salt, aerr := cacheSalt(v)
	if aerr != nil {
		return g, aerr
	}
	if so := v.Get("stream_options"); so != nil && so.Type() != fastjson.TypeNull {
		if so.Type() != fastjson.TypeObject {
			return g, badRequest("stream_options", "stream_options: Input should be a valid dictionary")
		}
		// vLLM's StreamOptions.include_usage defaults to true.
		if g.includeUsage, aerr = getBool(so, "include_usage", true); aerr != nil {
			return g, aerr
		}
		if s.api.refuseContinuousUsage && so.Get("continuous_usage_stats") != nil {
			return g, badRequest("stream_options.continuous_usage_stats", "Unrecognized request argument supplied: stream_options.continuous_usage_stats")
		}
		if g.continuousUsage, aerr = getBool(so, "continuous_usage_stats", false); aerr != nil {
			return g, aerr
		}
		g.continuousUsage = g.continuousUsage && g.includeUsage && s.api.continuousUsage
		if !g.stream {
			return g, badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
		}
	}
	pr := newPrompt(false, false)
	if s.prefixCaching {
		// About four bytes a token, and the body is more than the prompt:
		// enough room for the hashes, seldom much more.
		pr.blocks = newBlockHasher(s.blockSize, salt, len(body)/(4*s.blockSize)+1)
		pr.blocks.keep = s.kvEvents != nil
	}
	if chat {
		aerr = chatTemplate(v, &pr)
	} else {
		aerr = completionPrompt(v, &pr, true)
	}
	if aerr != nil {
		return g, aerr
	}

	if model != s.model {
		return g, modelNotFound(model)
	}

	g.promptTokens = pr.tokens
	g.blocks = pr.blocks
	if pr.tokens >= s.maxModelLen {
		return g, badRequest("input_tokens", "This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.",
			s.maxModelLen, pr.tokens)
	}
	limit := maxTokens
	if chat && maxCompletion.set {
		limit = maxCompletion // vLLM: max_completion_tokens or max_tokens
	}
	if limit.set && int64(pr.tokens)+limit.v > int64(s.maxModelLen) {
		return g, badRequest("max_tokens", "'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			limit.v, s.maxModelLen, pr.tokens, limit.v, s.maxModelLen, pr.tokens)
	}
	g.maxTokens = s.maxModelLen - pr.tokens
	if limit.set {
		if limit.v < 1 {
			return g, badRequest("max_tokens", "max_tokens must be at least 1, got %d.", limit.v)
		}
		g.maxTokens = int(limit.v)
	}
	if minTokens.set {
		if minTokens.v < 0 {
			return g, badRequest("min_tokens", "min_tokens must be greater than or equal to 0, got %d.", minTokens.v)
		}
		if minTokens.v > int64(g.maxTokens) {
			return g, badRequest("min_tokens", "min_tokens must be less than or equal to max_tokens=%d, got %d.", g.maxTokens, minTokens.v)
		}
		g.minTokens = int(minTokens.v)
	}
	if n.set {
		if n.v < 1 {
			return g, badRequest("n", "n must be at least 1, got %d.", n.v)
		}
		if n.v > math.MaxInt32 {
			return g, badRequest("n", "n must be at most %d, got %d.", math.MaxInt32, n.v)
		}
		g.n = int(n.v)
	}
	if !s.oom {
		// A request that could never be admitted whole would preempt itself
		// for ever; vLLM's scheduler ignores such a request, we refuse it.
		if g.n > s.maxNumSeqs {
			return g, badRequest("n", "n=%d is more than the %d sequences this server runs at once (max_num_seqs).", g.n, s.maxNumSeqs)
		}
		if peak := s.layout.RequestBlocks(g.promptTokens, g.maxTokens, g.n); peak > s.numBlocks-s.watermark {
			return g, badRequest("n", "%d sequences of %d prompt + %d output tokens need %d KV blocks at their largest, but the cache holds %d (%d kept free); this request could never complete.",
				g.n, g.promptTokens, g.maxTokens, peak, s.numBlocks, s.watermark)
		}
	}
	h := mix(s.seed) ^ pr.hash
	if chat {
		h = mix(h ^ 0x63686174)
	}
	h = mix(h ^ uint64(g.maxTokens))
	h = mix(h ^ uint64(g.n))
	if seed.set {
		h = mix(h ^ uint64(seed.v) ^ 0x73656564)
	}
	g.key = h
	g.lengths = s.lengthsFor(body)
	return g, nil
}

// cacheSalt reads cache_salt, vLLM's per-tenant isolation of the prefix
// cache: absent or null, or a non-empty string (vLLM's check). It is
// accepted, and has no effect, when the cache is off, as in vLLM.
func cacheSalt(v *fastjson.Value) ([]byte, *apiError) {
	f := v.Get("cache_salt")
	if f == nil || f.Type() == fastjson.TypeNull {
		return nil, nil
	}
	if f.Type() == fastjson.TypeString {
		if b, _ := f.StringBytes(); len(b) > 0 {
			return b, nil
		}
	}
	return nil, badRequest("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.")
}

// tokenizeParams is a parsed /tokenize request.
type tokenizeParams struct {
	prompt prompt
}

// parseTokenize reads vLLM's /tokenize request: {"prompt": ...,
// "add_special_tokens": true} or {"messages": [...], "add_generation_prompt":
// true}, with an optional "model" and "return_token_strs". The pieces of its
// text are taught to voc, for /detokenize.
func parseTokenize(p *fastjson.Parser, body []byte, s *settings, voc *vocab) (tokenizeParams, *apiError) {
	var t tokenizeParams
	v, err := p.ParseBytes(body)
	if err != nil {
		return t, badRequest("", "JSON decode error: %v", err)
	}
	if v.Type() != fastjson.TypeObject {
		return t, badRequest("", "Input should be a valid dictionary or object to extract fields from")
	}
	model, aerr := optString(v, "model")
	if aerr != nil {
		return t, aerr
	}
	strs, aerr := getBool(v, "return_token_strs", false)
	if aerr != nil {
		return t, aerr
	}
	t.prompt = newPrompt(true, strs)
	t.prompt.ids = []int{}
	if model == "" || model == s.model {
		t.prompt.vocab = voc // another model's text teaches nothing
	}
	if v.Get("messages") != nil {
		aerr = chatTemplate(v, &t.prompt)
	} else {
		aerr = completionPrompt(v, &t.prompt, true)
	}
	if aerr != nil {
		return t, aerr
	}
	if model != "" && model != s.model {
		return t, modelNotFound(model)
	}
	return t, nil
}

// parseDetokenize reads vLLM's /detokenize request: {"tokens": [ids]}, with
// an optional "model". It answers the ids, each checked to be in the
// vocabulary as vLLM checks them.
func parseDetokenize(p *fastjson.Parser, body []byte, s *settings) ([]int, *apiError) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, badRequest("", "JSON decode error: %v", err)
	}
	if v.Type() != fastjson.TypeObject {
		return nil, badRequest("", "Input should be a valid dictionary or object to extract fields from")
	}
	model, aerr := optString(v, "model")
	if aerr != nil {
		return nil, aerr
	}
	tv := v.Get("tokens")
	if tv == nil || tv.Type() == fastjson.TypeNull {
		return nil, badRequest("tokens", "tokens: Field required")
	}
	items, err := tv.Array()
	if err != nil {
		return nil, badRequest("tokens", "tokens: Input should be a valid list")
	}
	ids := make([]int, len(items))
	for i, it := range items {
		id, err := it.Int()
		if err != nil {
			return nil, badRequest("tokens", "tokens[%d]: Input should be a valid integer", i)
		}
		if id < 0 || id >= vocabSize {
			return nil, badRequest("tokens", "Token id %d is out of vocabulary", id)
		}
		ids[i] = id
	}
	if model != "" && model != s.model {
		return nil, modelNotFound(model)
	}
	return ids, nil
}

// chatTemplate reads how the messages are rendered — vLLM's
// add_generation_prompt (default true) and continue_final_message (default
// false: when true the last message is left open, for the model to go on
// with it) — and renders them into pr.
func chatTemplate(v *fastjson.Value, pr *prompt) *apiError {
	gen, aerr := getBool(v, "add_generation_prompt", true)
	if aerr != nil {
		return aerr
	}
	cont, aerr := getBool(v, "continue_final_message", false)
	if aerr != nil {
		return aerr
	}
	if gen && cont {
		return badRequest("continue_final_message", "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	return chatPrompt(v, pr, gen, cont)
}

// chatPrompt renders messages through the chat template into pr.
func chatPrompt(v *fastjson.Value, pr *prompt, generation, continueFinal bool) *apiError {
	mv := v.Get("messages")
	if mv == nil || mv.Type() == fastjson.TypeNull {
		return badRequest("messages", "messages: Field required")
	}
	msgs, err := mv.Array()
	if err != nil {
		return badRequest("messages", "messages: Input should be a valid list")
	}
	if len(msgs) == 0 {
		return badRequest("messages", "messages: List should have at least 1 item")
	}
	pr.chatBegin()
	if aerr := chatTools(v, pr); aerr != nil {
		return aerr
	}
	for i, m := range msgs {
		if m.Type() != fastjson.TypeObject {
			return badRequest("messages", "messages[%d]: Input should be a valid dictionary", i)
		}
		rv := m.Get("role")
		if rv == nil || rv.Type() != fastjson.TypeString {
			return badRequest("messages", "messages[%d].role: Field required (a string)", i)
		}
		role, _ := rv.StringBytes()
		pr.chatHeader(role)
		switch c := m.Get("content"); {
		case c == nil || c.Type() == fastjson.TypeNull:
		case c.Type() == fastjson.TypeString:
			b, _ := c.StringBytes()
			pr.text(b)
		case c.Type() == fastjson.TypeArray:
			parts, _ := c.Array()
			for j, part := range parts {
				if part.Type() != fastjson.TypeObject {
					return badRequest("messages", "messages[%d].content[%d]: Input should be a valid dictionary", i, j)
				}
				if ty := part.GetStringBytes("type"); string(ty) != "text" {
					return badRequest("messages", "messages[%d].content[%d]: content part of type %q is not supported by the simulator (only \"text\")", i, j, ty)
				}
				tv := part.Get("text")
				if tv == nil || tv.Type() != fastjson.TypeString {
					return badRequest("messages", "messages[%d].content[%d].text: Field required (a string)", i, j)
				}
				if j > 0 {
					pr.text(newline) // parts are joined with a newline, as vLLM's text-only rendering does
				}
				b, _ := tv.StringBytes()
				pr.text(b)
			}
		default:
			return badRequest("messages", "messages[%d].content: Input should be a valid string or list of content parts", i)
		}
		if !continueFinal || i < len(msgs)-1 {
			pr.chatEnd()
		}
	}
	if generation {
		pr.chatGenerationPrompt()
	}
	return nil
}

var newline = []byte("\n")

var toolsRole, toolBreak = []byte("tools"), []byte("\n\n")

// chatTools renders the request's tools, as templates with tool support
// do, in a message of their own before the others: each tool's JSON laid
// out with an indent of four (Jinja's tojson(indent=4)), two line breaks
// between tools.
func chatTools(v *fastjson.Value, pr *prompt) *apiError {
	tv := v.Get("tools")
	if tv == nil || tv.Type() == fastjson.TypeNull {
		return nil
	}
	tools, err := tv.Array()
	if err != nil {
		return badRequest("tools", "tools: Input should be a valid list")
	}
	if len(tools) == 0 {
		return nil
	}
	pr.chatHeader(toolsRole)
	var buf bytes.Buffer
	for i, t := range tools {
		if t.Type() != fastjson.TypeObject {
			return badRequest("tools", "tools[%d]: Input should be a valid dictionary", i)
		}
		if i > 0 {
			pr.text(toolBreak)
		}
		buf.Reset()
		if err := json.Indent(&buf, t.MarshalTo(nil), "", "    "); err != nil {
			return badRequest("tools", "tools[%d]: %v", i, err)
		}
		pr.text(buf.Bytes())
	}
	pr.chatEnd()
	return nil
}

// completionPrompt reads prompt: a string, a list of one string, a list of
// token ids, or a list of one list of token ids. A string gets the BOS token
// in front unless add_special_tokens is false, as vLLM's tokenizer adds it.
func completionPrompt(v *fastjson.Value, pr *prompt, specialDefault bool) *apiError {
	special, aerr := getBool(v, "add_special_tokens", specialDefault)
	if aerr != nil {
		return aerr
	}
	pv := v.Get("prompt")
	if pv == nil || pv.Type() == fastjson.TypeNull {
		return badRequest("prompt", "prompt: Field required")
	}
	str := func(b []byte) {
		if special {
			pr.special(tokBOS, "<|begin_of_text|>")
		}
		pr.text(b)
	}
	switch pv.Type() {
	case fastjson.TypeString:
		b, _ := pv.StringBytes()
		str(b)
		return nil
	case fastjson.TypeArray:
	default:
		return badRequest("prompt", "prompt: Input should be a valid string or list")
	}
	items, _ := pv.Array()
	if len(items) == 0 {
		return badRequest("prompt", "prompt: Input should be a non-empty string or list")
	}
	if items[0].Type() == fastjson.TypeString || items[0].Type() == fastjson.TypeArray {
		if len(items) > 1 {
			return badRequest("prompt", "prompt: a batch of %d prompts is not supported by the simulator; send one prompt per request", len(items))
		}
		if items[0].Type() == fastjson.TypeString {
			b, _ := items[0].StringBytes()
			str(b)
			return nil
		}
		if items, _ = items[0].Array(); len(items) == 0 {
			return badRequest("prompt", "prompt: Input should be a non-empty list of token ids")
		}
	}
	for i, it := range items {
		id, err := it.Int()
		if it.Type() != fastjson.TypeNumber || err != nil || id < 0 || id >= vocabSize {
			return badRequest("prompt", "prompt[%d]: token id must be an integer in [0, %d)", i, vocabSize)
		}
		pr.tokenID(id)
	}
	return nil
}

// optInt is an integer field that may be absent (or null).
type optInt struct {
	v   int64
	set bool
}

func getInt(v *fastjson.Value, name string) (optInt, *apiError) {
	f := v.Get(name)
	if f == nil || f.Type() == fastjson.TypeNull {
		return optInt{}, nil
	}
	if f.Type() == fastjson.TypeNumber {
		if i, err := f.Int64(); err == nil {
			return optInt{v: i, set: true}, nil
		}
		// Pydantic takes 16.0 as 16, but not 16.5.
		if x, err := f.Float64(); err == nil && x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return optInt{v: int64(x), set: true}, nil
		}
	}
	return optInt{}, badRequest(name, "%s: Input should be a valid integer", name)
}

func getBool(v *fastjson.Value, name string, def bool) (bool, *apiError) {
	f := v.Get(name)
	switch {
	case f == nil || f.Type() == fastjson.TypeNull:
		return def, nil
	case f.Type() == fastjson.TypeTrue:
		return true, nil
	case f.Type() == fastjson.TypeFalse:
		return false, nil
	}
	return def, badRequest(name, "%s: Input should be a valid boolean", name)
}

func optString(v *fastjson.Value, name string) (string, *apiError) {
	f := v.Get(name)
	if f == nil || f.Type() == fastjson.TypeNull {
		return "", nil
	}
	if f.Type() != fastjson.TypeString {
		return "", badRequest(name, "%s: Input should be a valid string", name)
	}
	b, _ := f.StringBytes()
	return string(b), nil
}
