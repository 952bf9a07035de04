package gateway

import (
	"fmt"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/internal/jsonscan"
)

// The pooling endpoints: vLLM's routes that run a prompt through the model
// and return what it pools from it (a vector, class probabilities, a
// score) without decoding a token.

// poolingInputs is what the gateway reads of a pooling request besides
// its model and inputs.
type poolingInputs struct {
	// truncate is vLLM's truncate_prompt_tokens: each input is cut to its
	// last truncate tokens before it runs. 0: not cut (-1, the model's
	// maximum, is the context length every input is held to anyway).
	truncate int
	// pairs: each input is a (query, document) pair of texts, counted
	// together, as a cross-encoder runs them in one prompt.
	pairs bool
}

// maxPoolingInputs bounds a pooling request's inputs, as OpenAI bounds an
// embeddings batch: each is a prompt the reservation holds blocks for.
const maxPoolingInputs = 2048

// The keys the gateway reads of a pooling body (see topLevelKeys).
var poolingKeys = []string{"model", "input", "messages", "tools", "truncate_prompt_tokens", "dimensions", "encoding_format",
	"text_1", "text_2", "queries", "documents", "query", "top_n"}

// parsePooling reads a pooling body with p, as parseRequest reads a
// completion's: one reading, by vLLM's rules (a duplicate key refused, an
// integer past int64 a 400 naming its field), of the fields that size the
// request: its inputs. Each input is one prompt of the request, which the
// backend runs as a request of its own. The returned request does not
// refer to p's memory.
func parsePooling(p *fastjson.Parser, body []byte, kind endpoint) (*request, error) {
	v, r, err := openBody(p, body, kind, poolingKeys)
	if err != nil {
		return nil, err
	}
	if u := v.Get("user"); u != nil && u.Type() == fastjson.TypeString {
		r.user = string(u.GetStringBytes())
	}
	for _, name := range [...]string{"truncate_prompt_tokens", "dimensions", "top_n"} {
		f := v.Get(name)
		if f == nil || f.Type() == fastjson.TypeNull {
			continue
		}
		n, err := intParam(f, name)
		if err != nil {
			return nil, err
		}
		switch {
		case name == "truncate_prompt_tokens" && n < -1, name != "truncate_prompt_tokens" && n < 0:
			return nil, badParam(name, "%s must not be negative, got %d", name, n)
		case name == "truncate_prompt_tokens" && n > 0:
			r.pool.truncate = int(min(n, 1<<31))
		}
	}
	if ef := v.Get("encoding_format"); ef != nil && ef.Type() != fastjson.TypeNull && ef.Type() != fastjson.TypeString {
		return nil, badParam("encoding_format", "encoding_format must be a string")
	}
	switch kind {
	case score, scoreV1:
		a, b := "text_1", "text_2"
		if v.Get(a) == nil && v.Get("queries") != nil {
			a, b = "queries", "documents"
		}
		err = r.readPairs(v, a, b)
	case rerank, rerankV1, rerankV2:
		q := v.Get("query")
		if q == nil || q.Type() != fastjson.TypeString {
			return nil, badParam("query", "query must be a string")
		}
		err = r.readPairs(v, "query", "documents")
	default:
		err = r.readInput(v)
	}
	if err != nil {
		return nil, err
	}
	if len(r.shapes) > maxPoolingInputs {
		return nil, badParam(r.inputParam(), "at most %d inputs in one request", maxPoolingInputs)
	}
	return r, nil
}

// inputParam names the field a pooling request's inputs are in, for errors.
func (r *request) inputParam() string {
	switch r.kind {
	case score, scoreV1:
		return "text_2"
	case rerank, rerankV1, rerankV2:
		return "documents"
	}
	return "input"
}

// readInput reads "input": a string, a list of strings, a list of token
// ids, or a list of lists of them; or, as vLLM takes it in its place, a
// chat's "messages", rendered to one prompt.
func (r *request) readInput(v *fastjson.Value) error {
	in := v.Get("input")
	if (in == nil || in.Type() == fastjson.TypeNull) && v.Get("messages") != nil {
		return r.readMessages(v)
	}
	if in == nil || in.Type() == fastjson.TypeNull {
		return badParam("input", "you must provide an input")
	}
	r.shapes = r.oneShape[:0]
	if in.Type() == fastjson.TypeString {
		r.shapes = append(r.shapes, textShape(in.GetStringBytes()))
		return nil
	}
	items, err := in.Array()
	if err != nil || len(items) == 0 {
		return badParam("input", "input must be a non-empty string, array of strings, or token ids")
	}
	if items[0].Type() == fastjson.TypeNumber { // one input of token ids
		if err := tokenIDArray(items, "input"); err != nil {
			return err
		}
		r.shapes = append(r.shapes, promptShape{tokenIDs: len(items), ids: true})
		return nil
	}
	for i, it := range items {
		param := fmt.Sprintf("input[%d]", i)
		switch it.Type() {
		case fastjson.TypeString:
			r.shapes = append(r.shapes, textShape(it.GetStringBytes()))
		case fastjson.TypeArray:
			ids, _ := it.Array()
			if len(ids) == 0 {
				return badParam(param, "each input of token ids must be a non-empty array")
			}
			if err := tokenIDArray(ids, param); err != nil {
				return err
			}
			r.shapes = append(r.shapes, promptShape{tokenIDs: len(ids), ids: true})
		default:
			return badParam(param, "each input must be a string or an array of token ids")
		}
	}
	return nil
}

// tokenIDArray checks that ids are all integers, as vLLM's list[int].
func tokenIDArray(ids []*fastjson.Value, param string) error {
	for j, id := range ids {
		if _, err := intParam(id, fmt.Sprintf("%s[%d]", param, j)); err != nil {
			return err
		}
	}
	return nil
}

// readPairs reads the two sides a score or a rerank compares, a and b:
// each a string or a non-empty array of strings. A single first text is
// paired with each second; two arrays are paired one to one. Each pair is
// one prompt.
func (r *request) readPairs(v *fastjson.Value, a, b string) error {
	first, err := textList(v, a)
	if err != nil {
		return err
	}
	second, err := textList(v, b)
	if err != nil {
		return err
	}
	if len(first) != 1 && len(first) != len(second) {
		return badParam(a, "%s must be one text or as many as %s (%d), got %d", a, b, len(second), len(first))
	}
	r.pool.pairs = true
	r.shapes = r.oneShape[:0]
	for i, d := range second {
		q := first[0]
		if len(first) > 1 {
			q = first[i]
		}
		// A pair is one prompt: both texts and a separator between them.
		r.shapes = append(r.shapes, promptShape{textBytes: q.textBytes + d.textBytes + 1, pieces: q.pieces + d.pieces + 1})
	}
	return nil
}

// textList is the shapes of a field that is a string or a non-empty
// array of strings.
func textList(v *fastjson.Value, name string) ([]promptShape, error) {
	f := v.Get(name)
	if f == nil || f.Type() == fastjson.TypeNull {
		return nil, badParam(name, "you must provide %s", name)
	}
	if f.Type() == fastjson.TypeString {
		return []promptShape{textShape(f.GetStringBytes())}, nil
	}
	items, err := f.Array()
	if err != nil || len(items) == 0 {
		return nil, badParam(name, "%s must be a string or a non-empty array of strings", name)
	}
	out := make([]promptShape, len(items))
	for i, it := range items {
		if it.Type() != fastjson.TypeString {
			return nil, badParam(fmt.Sprintf("%s[%d]", name, i), "%s must be a string or an array of strings", name)
		}
		out[i] = textShape(it.GetStringBytes())
	}
	return out, nil
}

// poolingTexts finds, for the backend tokenizer, each input that is one
// text (JSON-quoted, as /tokenize is sent it). Pairs and chat messages
// are left to the estimate: the backend's /tokenize counts neither the way
// a cross-encoder or a pooling chat template runs them.
func poolingTexts(pp *fastjson.ParserPool, body []byte, r *request) error {
	if r.pool.pairs || len(r.shapes) == 0 || r.shapes[0].messages > 0 {
		return nil
	}
	p := pp.Get()
	defer pp.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return err
	}
	in := v.Get("input")
	items := []*fastjson.Value{in}
	if in.Type() == fastjson.TypeArray && (len(r.shapes) > 1 || !r.shapes[0].ids) {
		items, _ = in.Array()
	}
	r.prompts = make([]promptText, len(r.shapes))
	for i, sh := range r.shapes {
		if !sh.ids && i < len(items) {
			r.prompts[i].text = jsonscan.AppendString(nil, string(items[i].GetStringBytes()))
		}
	}
	return nil
}
