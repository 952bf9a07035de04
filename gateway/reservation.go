package gateway

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/kvbudget"
)

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
