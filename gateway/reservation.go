package gateway

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/kvgate/kvgate/kvbudget"
)

// A request's reservation, from its prompts' counts to what admission
// holds for it: the count step, the reserve step (both steps of the loop,
// loop.go), and the reservation that its answer's events then move
// (tally.go).

// reservation is what a request may grow to, prompt by prompt and choice by
// choice, and what it has generated so far: the admission Shape it is
// admitted with, and the bookkeeping that turns a stream's events into the
// ticket's Progress and Done. Choice i of a batch request belongs to prompt
// i / n (vLLM numbers them prompt-major). With best_of above n, vLLM runs
// more sequences than it returns choices; those cannot be seen finishing,
// so their prompt's blocks are given back only when the request ends.
type reservation struct {
	layout   kvbudget.KVLayout
	prompts  []int
	outs     []int
	n        int   // choices returned per prompt
	seqs     int   // sequences run per prompt
	gen      []int // tokens generated per choice, as counted (see choiceCount)
	counts   []choiceCount
	finished []bool
	maxGen   []int // tokens of the furthest choice of each prompt, an event ahead (choiceCount.ahead)
	one      *oneChoice
	// chains name each prompt's leading full blocks (prefix.go), or nil.
	chains [][]uint64
}

// oneChoice holds the slices of a reservation of one prompt and one
// choice, nearly every request, in its exchange, so that reserving
// allocates nothing. Its zero value is a reservation that has seen
// nothing.
type oneChoice struct {
	outs, gen, maxGen [1]int
	counts            [1]choiceCount
	finished          [1]bool
	shape             [1]admission.Group
}

// newReservation makes a reservation; one, when not nil, holds its slices
// if it is of one prompt and one choice (outs may be one.outs already).
func newReservation(l kvbudget.KVLayout, prompts, outs []int, n, seqs int, one *oneChoice) reservation {
	r := reservation{layout: l, prompts: prompts, outs: outs, n: n, seqs: seqs}
	if one != nil && len(prompts) == 1 && n == 1 {
		r.one = one
		r.gen, r.counts, r.finished, r.maxGen = one.gen[:], one.counts[:], one.finished[:], one.maxGen[:]
		return r
	}
	r.gen, r.counts = make([]int, len(prompts)*n), make([]choiceCount, len(prompts)*n)
	r.finished, r.maxGen = make([]bool, len(prompts)*n), make([]int, len(prompts))
	return r
}

// shape is the reservation as the scheduler sees it: one group per prompt.
func (r *reservation) shape() []admission.Group {
	var g []admission.Group
	if r.one != nil {
		g = r.one.shape[:]
	} else {
		g = make([]admission.Group, len(r.prompts))
	}
	for i, p := range r.prompts {
		g[i] = admission.Group{Prompt: p, Cap: max(r.outs[i], 1), Seqs: r.seqs, BlockTokens: r.layout.BlockSize, BlockBytes: r.layout.BytesPerBlock}
		if i < len(r.chains) {
			g[i].Prefix = r.chains[i]
		}
	}
	return g
}

// weight is the worst case in bytes, as admission weighs the shape: for
// each prompt, its shared full prompt blocks, plus each sequence's own
// blocks at its cap. The arithmetic saturates: a request too large to
// count is larger than any budget, and is refused as such rather than
// wrapped into a small one.
func (r *reservation) weight() int64 { return admission.WorstCaseBytes(r.shape()) }

// token notes what an event told of choice idx: text bytes generated
// (0: none), and the backend's own count of its tokens so far (reported <
// 0: none); byBytes says events may carry several tokens each (see
// choiceCount). It returns the choice's prompt and, when that prompt's
// furthest choice moved, its new length.
func (r *reservation) token(idx, textBytes, reported int, byBytes bool) (prompt, furthest int, moved bool) {
	if idx < 0 || idx >= len(r.gen) || r.finished[idx] {
		return 0, 0, false
	}
	c := &r.counts[idx]
	prompt = idx / r.n
	// No sequence generates past its cap, whatever a bound says.
	n := min(c.note(textBytes, reported, byBytes), max(r.outs[prompt], 1))
	r.gen[idx] = n
	// What the guard is told is what the sequence may hold before its
	// next event: an event's worth ahead of the count, within its cap.
	if n = min(n+c.ahead(), max(r.outs[prompt], n)); n <= r.maxGen[prompt] {
		return prompt, 0, false
	}
	r.maxGen[prompt] = n
	return prompt, n, true
}

// finish marks choice idx done after generating n tokens (n < 0: as many as
// were seen). ok is false when it was already, or when its sequences cannot
// all be seen finishing (best_of above n): then nothing is given back early.
func (r *reservation) finish(idx, n int) (prompt, generated int, ok bool) {
	if r.seqs != r.n || idx < 0 || idx >= len(r.finished) || r.finished[idx] {
		return 0, 0, false
	}
	r.finished[idx] = true
	if n < 0 {
		n = r.gen[idx]
	}
	return idx / r.n, n, true
}

func (r *reservation) maxOut() int {
	m := 0
	for _, o := range r.outs {
		m = max(m, o)
	}
	return m
}

// reservedOutput is the output tokens reserved across every choice.
func (r *reservation) reservedOutput() int {
	t := 0
	for _, o := range r.outs {
		t += o * r.seqs
	}
	return t
}

// The count step: each prompt's tokens, from the token ids the client
// sent, the token cache (tokencache.go), the backend's /tokenize, or else
// the calibrated estimate (estimate.go); and, where a GPU of the model
// holds shared prompt blocks once, the chain that names the prompt's full
// blocks (prefix.go says how). Where a count came from labels the
// prediction-error histogram.

// countPrompts counts each prompt's tokens by the model's strategy; exact
// says which counts are the backend's own (or token ids) rather than
// estimates. The backend strategy asks a backend of the model (the one
// with the most room: the request is bound to no GPU yet), picked only
// when the cache cannot answer; where it cannot answer either, the
// calibrated estimate stands in. backends.ErrNoBackend: none is left.
func (x *exchange) countPrompts() (counts []int, exact []bool, err error) {
	var be *backends.Backend
	if len(x.req.shapes) <= len(x.counts) { // one prompt: no allocation
		counts, exact = x.counts[:len(x.req.shapes)], x.exact[:len(x.req.shapes)]
	} else {
		counts, exact = make([]int, len(x.req.shapes)), make([]bool, len(x.req.shapes))
	}
	for i, sh := range x.req.shapes {
		if sh.ids {
			counts[i], exact[i] = sh.tokenIDs, true
			continue
		}
		if x.req.prompts != nil {
			n, err := x.tokenizeCached(&be, i)
			if err == nil {
				counts[i], exact[i] = n, true
				continue
			}
			if x.rctx.Err() != nil || errors.Is(err, backends.ErrNoBackend) {
				return nil, nil, err
			}
			reason := "error"
			if errors.Is(err, backends.ErrTokenizeTimeout) {
				reason = "timeout"
			}
			x.s.m.upstreamErrors.WithLabelValues(be.Name(), "tokenize").Inc()
			x.s.m.tokenizeFalls.WithLabelValues(x.label, reason).Inc()
			if ok, held := x.s.tokenizeWarn.allow(x.s.now()); ok {
				x.s.log.Warn("backend tokenize failed; estimating the prompt by its bound (kvgate_tokenize_fallbacks_total counts each)",
					"backend", be.Name(), "model", x.m.name, "err", err, "held_back", held)
			}
		}
		counts[i] = x.m.est.predict(sh)
		x.noteSource(sourceEstimate)
	}
	return counts, exact, nil
}

// promptText is one prompt as the client wrote it: a chat's messages and
// tools (nil when absent or null), or one prompt string of a completion
// (in text). It is what the backend's count depends on (with the model and
// the endpoint), so it keys the tokenize cache as it is, and a /tokenize
// body is built from it only when the cache cannot answer.
type promptText struct{ text, tools []byte }

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
			r.prompts[i].text = jsonscan.AppendString(nil, string(items[i].GetStringBytes()))
		}
	}
	return nil
}

// tokenizeBody appends to dst the vLLM /tokenize request for prompt i of
// r: the prompt exactly as the client sent it, so the backend counts what
// it will run.
func tokenizeBody(dst []byte, r *request, i int) []byte {
	dst = jsonscan.AppendString(append(dst, `{"model":`...), r.model)
	pt := r.prompts[i]
	if r.kind == completions || r.kind.pooling() {
		dst = append(append(dst, `,"prompt":`...), pt.text...)
		return append(dst, '}')
	}
	dst = append(append(dst, `,"add_generation_prompt":true,"messages":`...), pt.text...)
	if pt.tools != nil {
		dst = append(append(dst, `,"tools":`...), pt.tools...)
	}
	return append(dst, '}')
}

var (
	chatPromptKeys       = []string{"messages", "tools"}
	completionPromptKeys = []string{"prompt"}
)

// Sources of a request's prompt count, the tokenizer label of the
// prediction-error histogram.
const (
	sourceBackend  = "backend"  // the backend's /tokenize, asked now
	sourceCache    = "cache"    // the backend's /tokenize, answered earlier
	sourceEstimate = "estimate" // the calibrated estimate
)

// promptSources are where the model's prompt counts can come from.
func (m *model) promptSources() []string {
	switch {
	case m.tokenizer == "estimate":
		return []string{sourceEstimate}
	case m.tokens != nil:
		return []string{sourceBackend, sourceCache, sourceEstimate}
	default:
		return []string{sourceBackend, sourceEstimate} // the estimate stands in when /tokenize fails
	}
}

// tokenizeCached counts prompt i of the request through the model's cache,
// asking a backend on a miss (*be, picked on the first miss). For a single
// prompt, it remembers the key of a hit so that recordUsage can check it
// against the backend's usage.
func (x *exchange) tokenizeCached(be **backends.Backend, i int) (int, error) {
	c := x.m.tokens
	var k tokenKey
	share := x.rt.sharesAny(x.req.model)
	if c != nil {
		k = c.key(x.req, i)
		bs := 0
		if share {
			bs = max(x.m.layout.BlockSize, 1)
		}
		if n, chain, ok := c.lookup(k, bs); ok {
			x.noteSource(sourceCache)
			if len(x.req.shapes) == 1 {
				x.cacheHit, x.cacheKey, x.cacheCount = true, k, n
			}
			if share {
				x.setChain(i, chain)
			}
			return n, nil
		}
	}
	if err := x.pickTokenizer(be); err != nil {
		return 0, err
	}
	if share {
		// A GPU of the model holds shared blocks once: the token ids name
		// this prompt's (prefix.go).
		ids := idBufs.Get().(*[]uint32)
		defer func() {
			if cap(*ids) <= 1<<16 { // a rare huge prompt's buffer is not kept
				idBufs.Put(ids)
			}
		}()
		n, err := (*be).TokenizeIDs(&x.rctx, tokenizeBody(nil, x.req, i), ids)
		if err != nil {
			return 0, err
		}
		bs := max(x.m.layout.BlockSize, 1)
		chain := promptChain(make([]uint64, 0, len(*ids)/bs), x.s.prefixSeed, x.req.model, *ids, bs)
		x.setChain(i, chain)
		x.noteSource(sourceBackend)
		if c != nil {
			c.putChain(k, n, chain)
		}
		return n, nil
	}
	n, err := (*be).Tokenize(&x.rctx, tokenizeBody(nil, x.req, i))
	if err != nil {
		return 0, err
	}
	x.noteSource(sourceBackend)
	if c != nil {
		c.put(k, n)
	}
	return n, nil
}

// pickTokenizer picks the backend that counts the request's prompts, once.
func (x *exchange) pickTokenizer(be **backends.Backend) error {
	if *be != nil {
		return nil
	}
	b, err := x.rt.upstreams.Pick(x.req.model, nil)
	if err != nil {
		return err
	}
	*be = b
	return nil
}

// noteSource records how a prompt of the request was counted; an estimate
// anywhere makes the whole request's count an estimate, else any cached
// count makes it a cached one.
func (x *exchange) noteSource(s string) {
	switch {
	case x.source == sourceEstimate:
	case s == sourceEstimate, x.source == "", x.source == sourceBackend:
		x.source = s
	}
}

// checkCached drops a cached count that the backend's own usage
// contradicts.
func (x *exchange) checkCached() {
	if x.cacheHit && x.usage.prompt > 0 && x.usage.prompt != x.cacheCount {
		x.m.tokens.forget(x.cacheKey, x.cacheCount)
	}
}

// idBufs are the buffers a /tokenize answer's token ids are read into:
// only the chain made of them is kept.
var idBufs = sync.Pool{New: func() any { b := make([]uint32, 0, 4096); return &b }}

// salted is chain as requests with cache_salt salt name it: the same
// chain for no salt, else each name mixed with the salt, so that two
// salts never name a block alike. It never writes chain (the tokenize
// cache's entries are read concurrently).
func salted(seed maphash.Seed, chain []uint64, salt string) []uint64 {
	if salt == "" {
		return chain
	}
	var h maphash.Hash
	h.SetSeed(seed)
	writeLenPrefixed(&h, []byte(salt))
	root := h.Sum64()
	out := make([]uint64, len(chain))
	var buf [16]byte
	for j, name := range chain {
		binary.LittleEndian.PutUint64(buf[:8], root)
		binary.LittleEndian.PutUint64(buf[8:], name)
		out[j] = maphash.Bytes(seed, buf[:])
	}
	return out
}

// setChain gives prompt i of the request its chain, as its cache_salt
// names it.
func (x *exchange) setChain(i int, chain []uint64) {
	if x.chains == nil {
		x.chains = make([][]uint64, len(x.req.shapes))
	}
	x.chains[i] = salted(x.s.prefixSeed, chain, x.req.cacheSalt)
}

// sharesAny says whether a GPU that may serve model holds shared prompt
// blocks once now: only then is a prompt's chain worth its token ids.
func (rt *runtime) sharesAny(model string) bool {
	if m := rt.models[model]; m != nil && m.kvEvents {
		return true // the index names a GPU's cached blocks alike
	}
	for _, g := range rt.gpus {
		if !g.sharing.Load() {
			continue
		}
		for _, b := range g.backends {
			for _, m := range b.Spec().Models {
				if m == model {
					return true
				}
			}
		}
	}
	return false
}

// The reserve step.

// reserve turns token counts into the reservation, or into the 400 that a
// request over the model's context length gets. Only an exact count can
// prove a request too long: an estimate errs high on purpose, so where it
// says "too long" the whole context is reserved and the backend judges.
// A model's default_max_tokens is sent to the backend (x.injectMax), or the
// backend would generate past what was reserved.
func (x *exchange) reserve(prompts []int, exact []bool) *apiError {
	m, req := x.m, x.req
	param := req.promptParam()
	outs := x.outsFor(len(prompts))
	for i, p := range prompts {
		x.predicted += p
		room := m.maxLen - p
		switch {
		case req.maxTokens > 0:
			outs[i] = req.maxTokens
		case m.defaultMax > 0 && m.defaultMax <= room:
			outs[i] = m.defaultMax
		case m.defaultMax > 0 && exact[i]:
			outs[i] = max(room, 1) // vLLM caps its own default to the room left
		default:
			outs[i] = max(room, 0)
		}
		if p+outs[i] <= m.maxLen && room > 0 {
			continue
		}
		if exact[i] {
			return &apiError{status: 400, typ: typeInvalidRequest, code: "context_length_exceeded", param: param,
				message: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
					m.maxLen, p+outs[i], p, outs[i])}
		}
		prompts[i] = min(p, m.maxLen)
		outs[i] = m.maxLen - prompts[i]
	}
	if req.maxTokens == 0 && m.defaultMax > 0 {
		x.injectMax = m.defaultMax
		for i, o := range outs {
			if prompts[i]+m.defaultMax <= m.maxLen {
				x.injectMax = min(x.injectMax, o)
			} else if !exact[i] {
				x.injectMax = 0 // an estimate too long for the default: leave the backend its own
				break
			}
		}
	}
	x.res = newReservation(m.layout, prompts, outs, req.n, req.seqs, &x.one)
	x.res.chains = x.chains
	return nil
}

// outsFor is the slice of output caps for n prompts: the exchange's own
// for one, nearly every request, so that reserving allocates nothing.
func (x *exchange) outsFor(n int) []int {
	if n == 1 {
		return x.one.outs[:]
	}
	return make([]int, n)
}
