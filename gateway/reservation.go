package gateway

import (
	"math"

	"github.com/kvgate/kvgate/kvbudget"
)

// reservation is the KV a request holds, prompt by prompt and choice by
// choice, so that a choice which finishes early gives its blocks back while
// its siblings still run. Choice i of a batch request belongs to prompt
// i / n (vLLM numbers them prompt-major). With best_of above n, vLLM runs
// more sequences than it returns choices; those are released only when the
// request ends, never early.
type reservation struct {
	layout   kvbudget.KVLayout
	prompts  []int
	outs     []int
	n        int // choices returned per prompt
	seqs     int // sequences run per prompt
	finished []bool
	left     []int // unfinished sequences per prompt
}

func newReservation(l kvbudget.KVLayout, prompts, outs []int, n, seqs int) reservation {
	r := reservation{layout: l, prompts: prompts, outs: outs, n: n, seqs: seqs, finished: make([]bool, len(prompts)*n), left: make([]int, len(prompts))}
	for i := range r.left {
		r.left[i] = seqs
	}
	return r
}

// weight is the bytes still reserved: for each prompt with a running
// choice, its shared full prompt blocks, plus each running choice's own.
// The arithmetic saturates: a request too large to count is larger than
// any budget, and is refused as such rather than wrapped into a small one.
func (r *reservation) weight() int64 {
	var blocks int64
	for i, p := range r.prompts {
		if r.left[i] == 0 {
			continue
		}
		shared := int64(p / r.layout.BlockSize)
		own := kvbudget.Blocks(int(satAdd(int64(p), int64(r.outs[i]))), r.layout.BlockSize) - shared
		blocks = satAdd(blocks, satAdd(shared, satMul(int64(r.left[i]), own)))
	}
	return satMul(blocks, r.layout.BytesPerBlock)
}

// satAdd and satMul are a+b and a×b for sizes (non-negative), stopping at
// math.MaxInt64 instead of wrapping.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// finish marks choice idx done; it returns the new weight and whether it
// changed.
func (r *reservation) finish(idx int) (int64, bool) {
	if r.seqs != r.n || idx < 0 || idx >= len(r.finished) || r.finished[idx] {
		return 0, false
	}
	r.finished[idx] = true
	r.left[idx/r.n]--
	return r.weight(), true
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
