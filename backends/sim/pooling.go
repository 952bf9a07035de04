package sim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// The pooling routes: embeddings, pooling, classification, scoring and
// reranking, in vLLM's request and response shapes. Each input (or each
// pair of texts a score or a rerank compares) is one engine request whose
// only step is its prefill: it holds its prompt's blocks for that step and
// generates nothing (request.pooling), so a flood of them fills the KV pool
// as vLLM's would. What they answer — vectors, probabilities, scores — is
// drawn from the tokens' hash: deterministic, and meaningless.

// poolKind is which pooling route a request came by.
type poolKind uint8

const (
	poolEmbed poolKind = iota
	poolPooling
	poolClassify
	poolScore
	poolRerank
)

// embedDim is the length of a vector the simulator answers when the
// request asks for no dimensions.
const embedDim = 64

// poolInput is one input of a pooling request: what the engine runs.
type poolInput struct {
	tokens int
	hash   uint64
	doc    string // a rerank's document, returned with its result
}

// poolParams is a parsed pooling request.
type poolParams struct {
	kind   poolKind
	inputs []poolInput
	base64 bool // encoding_format "base64"
	dims   int  // vector length
	topN   int  // a rerank's top_n; 0: every document
}

// parsePooling reads a pooling body as vLLM does: JSON and field types,
// then the model (404), then each input's length against the context.
func parsePooling(p *fastjson.Parser, body []byte, kind poolKind, s *settings) (poolParams, *apiError) {
	pp := poolParams{kind: kind, dims: embedDim}
	v, err := p.ParseBytes(body)
	if err != nil {
		return pp, badRequest("", "JSON decode error: %v", err)
	}
	if v.Type() != fastjson.TypeObject {
		return pp, badRequest("", "Input should be a valid dictionary or object to extract fields from")
	}
	model, aerr := optString(v, "model")
	if aerr != nil {
		return pp, aerr
	}
	special, aerr := getBool(v, "add_special_tokens", true)
	if aerr != nil {
		return pp, aerr
	}
	switch kind {
	case poolScore:
		aerr = pp.readPairs(v, special, "text_1", "text_2", "queries", "documents")
	case poolRerank:
		aerr = pp.readRerank(v, special)
	default:
		aerr = pp.readInputs(v, special)
	}
	if aerr != nil {
		return pp, aerr
	}
	if kind == poolEmbed || kind == poolPooling {
		if aerr = pp.readEncoding(v); aerr != nil {
			return pp, aerr
		}
	}
	if model != s.model { // a missing one too, as for completions
		return pp, modelNotFound(model)
	}
	for _, in := range pp.inputs {
		if in.tokens > s.maxModelLen {
			return pp, badRequest("input", "This model's maximum context length is %d tokens. However, you requested %d tokens in the input for embedding generation. Please reduce the length of the input.",
				s.maxModelLen, in.tokens)
		}
	}
	return pp, nil
}

func (pp *poolParams) readEncoding(v *fastjson.Value) *apiError {
	f, aerr := optString(v, "encoding_format")
	if aerr != nil {
		return aerr
	}
	switch f {
	case "", "float":
	case "base64":
		pp.base64 = true
	default:
		return badRequest("encoding_format", "encoding_format: Input should be 'float' or 'base64'")
	}
	d, aerr := getInt(v, "dimensions")
	if aerr != nil {
		return aerr
	}
	if d.set {
		if d.v < 1 || d.v > 1<<16 {
			return badRequest("dimensions", "dimensions must be between 1 and %d, got %d", 1<<16, d.v)
		}
		pp.dims = int(d.v)
	}
	return nil
}

// readInputs reads "input" (a string, a list of strings, a list of token
// ids or a list of lists of them) or, in its place, chat "messages".
func (pp *poolParams) readInputs(v *fastjson.Value, special bool) *apiError {
	iv := v.Get("input")
	if (iv == nil || iv.Type() == fastjson.TypeNull) && v.Get("messages") != nil {
		pr := newPrompt(false, false)
		if aerr := chatPrompt(v, &pr, false, false); aerr != nil {
			return aerr
		}
		pp.inputs = append(pp.inputs, poolInput{tokens: pr.tokens, hash: pr.hash})
		return nil
	}
	if iv == nil || iv.Type() == fastjson.TypeNull {
		return badRequest("input", "input: Field required")
	}
	text := func(b []byte) poolInput {
		pr := newPrompt(false, false)
		if special {
			pr.special(tokBOS, "<|begin_of_text|>")
		}
		pr.text(b)
		return poolInput{tokens: pr.tokens, hash: pr.hash}
	}
	if iv.Type() == fastjson.TypeString {
		pp.inputs = append(pp.inputs, text(iv.GetStringBytes()))
		return nil
	}
	items, err := iv.Array()
	if err != nil || len(items) == 0 {
		return badRequest("input", "input: Input should be a non-empty string or list")
	}
	if items[0].Type() == fastjson.TypeNumber {
		in, aerr := poolTokenIDs(items, "input")
		if aerr != nil {
			return aerr
		}
		pp.inputs = append(pp.inputs, in)
		return nil
	}
	for i, it := range items {
		switch it.Type() {
		case fastjson.TypeString:
			pp.inputs = append(pp.inputs, text(it.GetStringBytes()))
		case fastjson.TypeArray:
			ids, _ := it.Array()
			if len(ids) == 0 {
				return badRequest("input", "input[%d]: Input should be a non-empty list of token ids", i)
			}
			in, aerr := poolTokenIDs(ids, "input")
			if aerr != nil {
				return aerr
			}
			pp.inputs = append(pp.inputs, in)
		default:
			return badRequest("input", "input[%d]: Input should be a valid string or list of token ids", i)
		}
	}
	return nil
}

func poolTokenIDs(items []*fastjson.Value, param string) (poolInput, *apiError) {
	pr := newPrompt(false, false)
	for i, it := range items {
		id, err := it.Int()
		if it.Type() != fastjson.TypeNumber || err != nil || id < 0 || id >= vocabSize {
			return poolInput{}, badRequest(param, "%s[%d]: token id must be an integer in [0, %d)", param, i, vocabSize)
		}
		pr.tokenID(id)
	}
	return poolInput{tokens: pr.tokens, hash: pr.hash}, nil
}

// texts reads a field that is a string or a list of strings.
func texts(v *fastjson.Value, name string) ([][]byte, *apiError) {
	f := v.Get(name)
	if f == nil || f.Type() == fastjson.TypeNull {
		return nil, badRequest(name, "%s: Field required", name)
	}
	if f.Type() == fastjson.TypeString {
		return [][]byte{f.GetStringBytes()}, nil
	}
	items, err := f.Array()
	if err != nil || len(items) == 0 {
		return nil, badRequest(name, "%s: Input should be a non-empty string or list of strings", name)
	}
	out := make([][]byte, len(items))
	for i, it := range items {
		if it.Type() != fastjson.TypeString {
			return nil, badRequest(name, "%s[%d]: Input should be a valid string", name, i)
		}
		out[i] = it.GetStringBytes()
	}
	return out, nil
}

// pair is one (query, document) input of a cross-encoder: both texts
// in one prompt, as vLLM's score and rerank run them.
func pair(q, d []byte, special bool) poolInput {
	pr := newPrompt(false, false)
	if special {
		pr.special(tokBOS, "<|begin_of_text|>")
	}
	pr.text(q)
	if special {
		pr.special(tokEOT, "<|eot_id|>")
	}
	pr.text(d)
	return poolInput{tokens: pr.tokens, hash: pr.hash}
}

// readPairs reads a score's two sides (text_1 and text_2, or queries and
// documents): one first text is scored against each second; two lists
// are paired one to one and must be as long.
func (pp *poolParams) readPairs(v *fastjson.Value, special bool, a, b, a2, b2 string) *apiError {
	if v.Get(a) == nil && v.Get(a2) != nil {
		a, b = a2, b2
	}
	t1, aerr := texts(v, a)
	if aerr != nil {
		return aerr
	}
	t2, aerr := texts(v, b)
	if aerr != nil {
		return aerr
	}
	if len(t1) != 1 && len(t1) != len(t2) {
		return badRequest(a, "%s and %s must be of the same length, or %s a single text (got %d and %d)", a, b, a, len(t1), len(t2))
	}
	for i, d := range t2 {
		q := t1[0]
		if len(t1) > 1 {
			q = t1[i]
		}
		pp.inputs = append(pp.inputs, pair(q, d, special))
	}
	return nil
}

// readRerank reads a rerank: a query, its documents and top_n.
func (pp *poolParams) readRerank(v *fastjson.Value, special bool) *apiError {
	qv := v.Get("query")
	if qv == nil || qv.Type() != fastjson.TypeString {
		return badRequest("query", "query: Field required (a string)")
	}
	docs, aerr := texts(v, "documents")
	if aerr != nil {
		return aerr
	}
	top, aerr := getInt(v, "top_n")
	if aerr != nil {
		return aerr
	}
	if top.v < 0 {
		return badRequest("top_n", "top_n must be >= 0, got %d", top.v)
	}
	pp.topN = int(min(top.v, int64(len(docs))))
	for _, d := range docs {
		in := pair(qv.GetStringBytes(), d, special)
		in.doc = string(d)
		pp.inputs = append(pp.inputs, in)
	}
	return nil
}

// pool serves a pooling route: every input runs as one engine request,
// all at once, and the answer waits for the last. A client that hangs up
// meanwhile has them all aborted, their blocks freed at once.
func (s *Server) pool(ctx *fasthttp.RequestCtx, kind poolKind) {
	p := s.parsers.Get()
	pp, aerr := parsePooling(p, ctx.PostBody(), kind, s.set)
	s.parsers.Put(p)
	if aerr != nil {
		s.writeError(ctx, aerr)
		return
	}
	rs := make([]*request, len(pp.inputs))
	for i, in := range pp.inputs {
		r := newRequest(in.tokens, 1, 1, s.now())
		r.pooling = true
		r.seqs[0].target = 1
		if err := s.eng.submit(r); err != nil {
			for _, q := range rs[:i] {
				s.eng.abort(q)
			}
			s.writeError(ctx, errorFor(err))
			return
		}
		rs[i] = r
	}
	stop := func() {}
	if s.watch != nil {
		if unwatch, err := s.watch.Watch(ctx.Conn(), func() {
			for _, r := range rs {
				s.eng.cancel(r, errClientGone)
			}
		}); err == nil {
			stop = func() { unwatch() }
		}
	}
	var failed error
	for _, r := range rs {
		for r.status.Load() == statusActive {
			<-r.wake
		}
		if r.status.Load() == statusFailed {
			failed = r.err
			break
		}
	}
	stop()
	if failed != nil {
		for _, r := range rs {
			s.eng.abort(r)
		}
		s.writeError(ctx, errorFor(failed))
		return
	}
	body, err := s.poolAnswer(pp)
	if err != nil {
		s.writeError(ctx, serverError(err))
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// poolUsage is vLLM's UsageInfo of a pooling answer: prompt tokens only.
type poolUsage struct {
	PromptTokens        int  `json:"prompt_tokens"`
	TotalTokens         int  `json:"total_tokens"`
	CompletionTokens    int  `json:"completion_tokens"`
	PromptTokensDetails *int `json:"prompt_tokens_details"`
}

type poolHead struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   json.RawMessage `json:"model"`
	Data    []any           `json:"data"`
	Usage   poolUsage       `json:"usage"`
}

// poolAnswer is the body vLLM answers a pooling request of kind with.
func (s *Server) poolAnswer(pp poolParams) ([]byte, error) {
	tokens := 0
	for _, in := range pp.inputs {
		tokens += in.tokens
	}
	if pp.kind == poolRerank {
		return json.Marshal(s.rerankAnswer(pp, tokens))
	}
	prefix := map[poolKind]string{poolEmbed: "embd-", poolPooling: "pool-", poolClassify: "classify-", poolScore: "score-"}[pp.kind]
	h := poolHead{ID: s.newPoolID(prefix), Object: "list", Created: s.now().Unix(), Model: s.modelJSON,
		Usage: poolUsage{PromptTokens: tokens, TotalTokens: tokens}}
	for i, in := range pp.inputs {
		switch pp.kind {
		case poolEmbed, poolPooling:
			object, field := "embedding", "embedding"
			if pp.kind == poolPooling {
				object, field = "pooling", "data"
			}
			h.Data = append(h.Data, map[string]any{"index": i, "object": object, field: vector(in.hash, pp.dims, pp.base64)})
		case poolClassify:
			p := unit(in.hash)
			label := "LABEL_0"
			if p < 0.5 {
				label = "LABEL_1"
			}
			h.Data = append(h.Data, map[string]any{"index": i, "label": label, "probs": []float64{p, 1 - p}, "num_classes": 2})
		case poolScore:
			h.Data = append(h.Data, map[string]any{"index": i, "object": "score", "score": unit(in.hash)})
		}
	}
	return json.Marshal(h)
}

// rerankAnswer is vLLM's RerankResponse: results best first, top_n of
// them, usage as total tokens only.
func (s *Server) rerankAnswer(pp poolParams, tokens int) any {
	type doc struct {
		Text string `json:"text"`
	}
	type result struct {
		Index          int     `json:"index"`
		Document       doc     `json:"document"`
		RelevanceScore float64 `json:"relevance_score"`
	}
	type usage struct {
		TotalTokens int `json:"total_tokens"`
	}
	a := struct {
		ID      string          `json:"id"`
		Model   json.RawMessage `json:"model"`
		Usage   usage           `json:"usage"`
		Results []result        `json:"results"`
	}{ID: s.newPoolID("rerank-"), Model: s.modelJSON, Usage: usage{TotalTokens: tokens}, Results: []result{}}
	for i, in := range pp.inputs {
		a.Results = append(a.Results, result{Index: i, Document: doc{Text: in.doc}, RelevanceScore: unit(in.hash)})
	}
	slices.SortStableFunc(a.Results, func(x, y result) int {
		switch {
		case x.RelevanceScore > y.RelevanceScore:
			return -1
		case x.RelevanceScore < y.RelevanceScore:
			return 1
		}
		return 0
	})
	if pp.topN > 0 {
		a.Results = a.Results[:pp.topN]
	}
	return a
}

// newPoolID is a pooling answer's id, as newID makes a completion's.
func (s *Server) newPoolID(prefix string) string {
	n := s.idSeq.Add(1)
	out := appendHex64([]byte(prefix), mix(s.idSalt^n))
	return string(out)
}

// vector is a unit vector of dims drawn from h: float32s as a JSON array,
// or their little-endian bytes in base64, as vLLM encodes them.
func vector(h uint64, dims int, b64 bool) any {
	v := make([]float32, dims)
	var norm float64
	for i := range v {
		x := unit(h+uint64(i)) - 0.5
		v[i] = float32(x)
		norm += x * x
	}
	if norm = math.Sqrt(norm); norm > 0 {
		for i := range v {
			v[i] = float32(float64(v[i]) / norm)
		}
	}
	if !b64 {
		return v
	}
	buf := make([]byte, 4*dims)
	for i, x := range v {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(buf)
}
