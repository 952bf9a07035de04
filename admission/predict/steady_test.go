package predict

import (
	"math"
	"math/rand/v2"
	"testing"
)

// How full the bound keeps a pool of steady traffic: closed-loop requests
// (340-token prompts, lognormal outputs of median 200 and σ 0.8, capped at
// 1024) admitted while the peak of the batch's curve, candidate included,
// fits 2888 blocks — the benchmark's two-tenant batch on its simulator —
// with each sequence a block and two tokens ahead (Lead 17, the
// admission's lead for a curve up to a block stale). What runs never
// passes the pool, and fills about 90 % of it; the rest is the bound's
// price: the lead and z.
func TestBoundKeepsASteadyBatchFull(t *testing.T) {
	const (
		pool   = 2888
		prompt = 340
		maxLen = 1024
		steps  = 4000
	)
	r := rand.New(rand.NewPCG(1, 2))
	draw := func() int { return max(1, int(200*math.Exp(0.8*r.NormFloat64()))) }
	l, _ := NewLengths(LengthsConfig{MaxLen: 8192})
	for range 2000 {
		n := draw()
		l.Observe(min(n, maxLen), n >= maxLen)
	}
	z := Z(1e-4)
	type seq struct{ gen, length int }
	var run []seq
	mean, vari, hi := make([]float64, GridLen), make([]float64, GridLen), make([]float64, GridLen)
	var used float64
	for step := range steps {
		kept := run[:0]
		for _, s := range run {
			if s.gen++; s.gen < min(s.length, maxLen) {
				kept = append(kept, s)
			}
		}
		run = kept
		for {
			clear(mean)
			clear(vari)
			clear(hi)
			for _, s := range append(run, seq{}) {
				Item{Prompt: prompt, Generated: s.gen, Cap: maxLen, Seqs: 1, BlockTokens: 16, BlockBytes: 1, Lead: 17, Lengths: l}.AddWithAllAlive(mean, vari, hi)
			}
			peak := math.Inf(-1)
			for k := range mean {
				peak = max(peak, min(mean[k]+z*math.Sqrt(vari[k]), hi[k]))
			}
			if peak > pool {
				break
			}
			run = append(run, seq{length: draw()})
		}
		now := 0 // what runs holds, the next token's slot included
		for _, s := range run {
			now += (prompt + s.gen + 1 + 15) / 16
		}
		if now > pool {
			t.Fatalf("step %d: %d sequences hold %d blocks of %d", step, len(run), now, pool)
		}
		if step >= steps/4 {
			used += float64(now) / pool
		}
	}
	full := used / (steps - steps/4)
	t.Logf("the pool %.1f %% full on average", 100*full)
	if full < 0.88 {
		t.Fatalf("the pool %.1f %% full: the bound holds back more than it did (90 %%)", 100*full)
	}
}
