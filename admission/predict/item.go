package predict

import (
	"errors"
	"fmt"
)

// Item is one running (or candidate) request as the forecast sees it.
type Item struct {
	Prompt      int   // prompt tokens (per sequence; the n sequences share its full blocks)
	Generated   int   // tokens each live sequence has generated so far, as the gateway has seen them (g)
	Cap         int   // max output tokens per sequence: it stops at g == Cap
	Seqs        int   // live sequences (n; >= 1)
	BlockTokens int   // KV block size in tokens
	BlockBytes  int64 // bytes of one block
	// Lead is how many tokens the backend may be ahead of what the gateway
	// has seen: added to Generated for size, not for survival.
	Lead int
	// Lengths is the learned output-length distribution; nil means
	// deterministic: alive until Cap, with no variance (warm-up, worst case).
	Lengths *Lengths
	// HeldShared is how many of the prompt's full blocks the item does not
	// count: blocks a GPU holds once for several requests (its prefix
	// cache), which the caller counts once on their own.
	HeldShared int64
}

// Validate says what is wrong with it, naming the field. The other methods
// do not refuse an invalid item (they have no error to return): they read
// each field clamped to its valid range (Seqs, BlockTokens and BlockBytes at
// least 1, the others at least 0).
func (it Item) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int64
		min  int64
	}{
		{"Prompt", int64(it.Prompt), 0},
		{"Generated", int64(it.Generated), 0},
		{"Cap", int64(it.Cap), 0},
		{"Seqs", int64(it.Seqs), 1},
		{"BlockTokens", int64(it.BlockTokens), 1},
		{"BlockBytes", it.BlockBytes, 1},
		{"Lead", int64(it.Lead), 0},
		{"HeldShared", it.HeldShared, 0},
	} {
		if f.v < f.min {
			errs = append(errs, fmt.Errorf("predict: Item.%s is %d; it must be >= %d", f.name, f.v, f.min))
		}
	}
	return errors.Join(errs...)
}

func (it Item) clamped() Item {
	it.Prompt = max(it.Prompt, 0)
	it.Generated = max(it.Generated, 0)
	it.Cap = max(it.Cap, 0)
	it.Seqs = max(it.Seqs, 1)
	it.BlockTokens = max(it.BlockTokens, 1)
	it.BlockBytes = max(it.BlockBytes, 1)
	it.Lead = max(it.Lead, 0)
	it.HeldShared = max(it.HeldShared, 0)
	return it
}

// shared is the blocks the sequences share: the prompt's full blocks.
func (it Item) shared() int64 { return int64(it.Prompt / it.BlockTokens) }

// own is the blocks one sequence holds beyond the shared ones when it has
// generated gen tokens: its partial prompt block and its output.
func (it Item) own(gen int) int64 {
	tokens := it.Prompt + gen
	return int64((tokens+it.BlockTokens-1)/it.BlockTokens) - it.shared()
}

// counted is the prompt's full blocks the item counts: those not held for
// it by another holder (HeldShared).
func (it Item) counted() int64 { return max(it.shared()-it.HeldShared, 0) }

// bytesAt is the item's size with every live sequence at gen generated
// tokens. The sequences of one request share its prompt's full blocks, as
// vLLM's parallel sampling does (kvbudget's GroupBlocks).
func (it Item) bytesAt(gen int) int64 {
	return (it.counted() + int64(it.Seqs)*it.own(gen)) * it.BlockBytes
}

// Final is the item's worst-case size in bytes: every sequence at Cap.
func (it Item) Final() int64 {
	it = it.clamped()
	return it.bytesAt(it.Cap)
}

// Now is its size in bytes at step 0, Lead included: the blocks it holds
// during the step that generates its next token (an engine takes the slot of
// a token when it schedules it), min(Generated+Lead+1, Cap) tokens of output
// per sequence.
func (it Item) Now() int64 {
	it = it.clamped()
	return it.bytesAt(min(it.Generated+it.Lead+1, it.Cap))
}

// AddTo adds the item's contribution to a curve at every grid point: the
// mean bytes to mean[k] and their variance to variance[k]. Both slices must
// hold at least GridLen points (a shorter one panics).
//
// At index k, mean[k] + z·sqrt(variance[k]), summed over independent items,
// bounds the memory over the whole interval [t_k, t_{k+1}) with probability
// about 1 − ε: each sequence counts with its size at the interval's end and
// its survival at its start. A sequence with g generated tokens and cap m is
// alive at step t with probability S(g+t)/S(g) while g+t < m, and 0 after;
// at step t it holds Prompt + min(g+Lead+t+1, m) tokens. At step 0 it is
// alive, whatever g and m (the caller removes it when it finishes). When S(g)
// is 0, or there is no sample past g, it is held until its cap without
// variance (the conservative reading of "unknown"). With Seqs > 1 the shared
// prompt blocks are held, without variance, while any sequence may be alive;
// each sequence's own blocks are an independent Bernoulli.
func (it Item) AddTo(mean, variance []float64) { it.add(mean, variance, 1) }

// SubFrom takes away what AddTo added, so that a caller can keep an
// aggregate curve incrementally. Rounding leaves tiny residues (Bound
// ignores a variance below zero).
func (it Item) SubFrom(mean, variance []float64) { it.add(mean, variance, -1) }

// AddWithAllAlive is AddTo, and also adds to hi the item's all-alive curve:
// what AddTo adds with Lengths nil (every sequence alive until its cap), a
// hard bound on what it can hold that the normal bound may exceed when
// there are few items. One pass instead of two. It returns the grid
// points it added to: the item has ended by the next one, so it adds nothing
// there or past it, and a caller that keeps a curve's extent need not
// visit them.
func (it Item) AddWithAllAlive(mean, variance, hi []float64) (points int) {
	return it.addCurves(mean, variance, hi[:GridLen], 1)
}

func (it Item) add(mean, variance []float64, sign float64) { it.addCurves(mean, variance, nil, sign) }

// addCurves returns the grid points it visited; past them it added nothing.
func (it Item) addCurves(mean, variance, hi []float64, sign float64) (points int) {
	mean, variance = mean[:GridLen], variance[:GridLen]
	it = it.clamped()
	g, m := it.Generated, it.Cap
	l := it.Lengths
	var inv float64 // 1 / S(g)
	if l != nil {
		if s0 := l.Survival(g); s0 > 0 {
			inv = 1 / s0
		} else {
			l = nil // every sample ended before g: nothing known, held until the cap
		}
	}
	bb := float64(it.BlockBytes)
	n := float64(it.Seqs)
	tokens := it.Prompt + it.BlockTokens - 1 // + output tokens, then ÷ BlockTokens: blocks rounded up
	shared := it.shared()
	// The prompt's full blocks: held while any sequence may be alive when
	// there are several, part of the one sequence's Bernoulli otherwise.
	held, inSeq := float64(it.counted())*bb, 0.0
	if it.Seqs == 1 {
		held, inSeq = 0, held
	}
	dead := false // survival reached 0: it never rises again
	for k := range GridLen {
		t := grid[k]
		if k > 0 && g+t >= m {
			return k
		}
		p := 1.0
		if l != nil && k > 0 && !dead {
			if p = min(l.Survival(g+t)*inv, 1); p <= 0 {
				dead = true
			}
		}
		if dead && hi == nil {
			return k
		}
		gen := m
		if k+1 < GridLen {
			gen = min(g+it.Lead+grid[k+1], m) // the size at step t_{k+1}−1
		}
		seq := float64(int64((tokens+gen)/it.BlockTokens)-shared)*bb + inSeq
		if hi != nil {
			hi[k] += sign * (held + n*seq)
		}
		if dead {
			continue
		}
		mean[k] += sign * (held + n*p*seq)
		if p < 1 {
			variance[k] += sign * n * p * (1 - p) * seq * seq
		}
	}
	return GridLen
}

// Remaining is the number of steps until the item finishes at quantile q of
// its conditional length (the smallest r with P(L <= g+r | L > g) >= q),
// capped at Cap − g; it is Cap − g when the item is deterministic (no
// Lengths), when nothing is known past g, and when q is outside (0, 1].
// For backfilling: how long a candidate would hold its blocks.
func (it Item) Remaining(q float64) int {
	it = it.clamped()
	left := max(it.Cap-it.Generated, 0)
	l := it.Lengths
	if l == nil || !(q > 0 && q <= 1) {
		return left
	}
	s0 := l.Survival(it.Generated)
	if s0 <= 0 {
		return left
	}
	x, ok := l.firstAtMost(it.Generated, (1-q)*s0)
	if !ok {
		return left
	}
	return min(max(x-it.Generated, 0), left)
}
