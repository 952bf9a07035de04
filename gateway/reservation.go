package gateway

import (
	"github.com/kvgate/kvgate/admission"
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
	gen      []int // tokens seen per choice
	finished []bool
	maxGen   []int // tokens seen of the furthest choice of each prompt
	one      *oneChoice
}

// oneChoice holds the slices of a reservation of one prompt and one
// choice, nearly every request, in its exchange, so that reserving
// allocates nothing. Its zero value is a reservation that has seen
// nothing.
type oneChoice struct {
	outs, gen, maxGen [1]int
	finished          [1]bool
	shape             [1]admission.Group
}

// newReservation makes a reservation; one, when not nil, holds its slices
// if it is of one prompt and one choice (outs may be one.outs already).
func newReservation(l kvbudget.KVLayout, prompts, outs []int, n, seqs int, one *oneChoice) reservation {
	r := reservation{layout: l, prompts: prompts, outs: outs, n: n, seqs: seqs}
	if one != nil && len(prompts) == 1 && n == 1 {
		r.one = one
		r.gen, r.finished, r.maxGen = one.gen[:], one.finished[:], one.maxGen[:]
		return r
	}
	r.gen, r.finished, r.maxGen = make([]int, len(prompts)*n), make([]bool, len(prompts)*n), make([]int, len(prompts))
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
	}
	return g
}

// weight is the worst case in bytes: for each prompt, its shared full
// prompt blocks, plus each sequence's own blocks at its cap. The
// arithmetic saturates: a request too large to count is larger than any
// budget, and is refused as such rather than wrapped into a small one.
func (r *reservation) weight() int64 {
	var total int64
	for i, p := range r.prompts {
		total = kvbudget.SumBytes(total, r.layout.GroupBytes(p, r.outs[i], r.seqs, 0))
	}
	return total
}

// token notes one generated token of choice idx. It returns the choice's
// prompt and, when that prompt's furthest choice moved, its new length.
func (r *reservation) token(idx int) (prompt, furthest int, moved bool) {
	if idx < 0 || idx >= len(r.gen) || r.finished[idx] {
		return 0, 0, false
	}
	r.gen[idx]++
	prompt = idx / r.n
	if r.gen[idx] <= r.maxGen[prompt] {
		return prompt, 0, false
	}
	r.maxGen[prompt] = r.gen[idx]
	return prompt, r.maxGen[prompt], true
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
