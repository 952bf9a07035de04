package predict_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/admission/predict"
)

// The chat workload of the design: natural output lengths lognormal with
// median 200 and σ 0.8, cut by max_tokens 1024; Llama-3-8B's KV blocks
// (16 tokens of 128 KiB).
const (
	chatMedian  = 200
	chatSigma   = 0.8
	chatCap     = 1024
	blockTokens = 16
	blockBytes  = 16 << 17
	trainSize   = 2000 // finished requests a Lengths learns from
	relearnEach = 50   // batches forecast with one learned Lengths before drawing a new one
)

func chatLength(rng *rand.Rand) int {
	return max(1, int(math.Round(chatMedian*math.Exp(chatSigma*rng.NormFloat64()))))
}

// learnChat learns from trainSize finished requests, those cut by the cap
// censored, as the gateway sees them.
func learnChat(t testing.TB, rng *rand.Rand) *predict.Lengths {
	l := learn(t, predict.LengthsConfig{MaxLen: 8192})
	for range trainSize {
		n := chatLength(rng)
		l.Observe(min(n, chatCap), n >= chatCap)
	}
	return l
}

// running is one request of a simulated batch: its item and its true length.
type running struct {
	it   predict.Item
	life int // steps it still runs: min(true length, cap) − generated
}

// draw makes a batch of n requests. Fresh ones have generated nothing (a
// burst admitted together); the others are caught mid-generation, as a batch
// in steady state is: a request is running with a probability proportional
// to its length (length-biased), at a uniform point of its life — so that,
// given what it generated, its true length follows the distribution
// conditioned on it, which is what the forecast assumes.
func draw(rng *rand.Rand, n int, fresh bool, prompt func(*rand.Rand) int, l *predict.Lengths) []running {
	batch := make([]running, n)
	for i := range batch {
		length := min(chatLength(rng), chatCap)
		for !fresh && rng.Float64()*chatCap >= float64(length) {
			length = min(chatLength(rng), chatCap)
		}
		g := 0
		if !fresh {
			g = rng.IntN(length)
		}
		batch[i] = running{
			it: predict.Item{
				Prompt: prompt(rng), Generated: g, Cap: chatCap, Seqs: 1,
				BlockTokens: blockTokens, BlockBytes: blockBytes, Lengths: l,
			},
			life: length - g,
		}
	}
	return batch
}

// realPeak is the largest memory the batch really holds, step by step, each
// request holding Prompt + g + t + 1 tokens at step t < life and nothing
// after (the simulated engine's accounting).
func realPeak(batch []running, diff []int64) int64 {
	horizon := 0
	for _, r := range batch {
		horizon = max(horizon, r.life)
	}
	diff = diff[:horizon+1]
	clear(diff)
	for _, r := range batch {
		base := r.it.Prompt + r.it.Generated + 1 // tokens at step 0
		diff[0] += int64((base + blockTokens - 1) / blockTokens)
		// A new block at each step whose token opens one: base+t ≡ 1 (mod block).
		first := (blockTokens + 1 - base%blockTokens) % blockTokens
		if first == 0 {
			first = blockTokens
		}
		for t := first; t < r.life; t += blockTokens {
			diff[t]++
		}
		diff[r.life] -= int64((base + r.life - 1 + blockTokens - 1) / blockTokens)
	}
	var held, peak int64
	for _, d := range diff[:horizon] {
		held += d
		peak = max(peak, held)
	}
	return peak * blockBytes
}

func TestRealPeak(t *testing.T) {
	// Prompt 14, blocks of 16: 15 tokens at step 0 (1 block), 17 at step 2 (2
	// blocks), 33 at step 18 (3 blocks), gone at step 19. Another request of
	// one step, 2 blocks, overlaps step 0 only.
	batch := []running{
		{it: predict.Item{Prompt: 14}, life: 19},
		{it: predict.Item{Prompt: 31}, life: 1},
	}
	if got := realPeak(batch, make([]int64, 20)); got != 3*blockBytes {
		t.Fatalf("peak %d blocks, want 3", got/blockBytes)
	}
	batch[1].life = 17 // now the second one (32..48 tokens: 2, then 3 blocks from step 1) overlaps the first's 2 blocks
	if got := realPeak(batch, make([]int64, 20)); got != 5*blockBytes {
		t.Fatalf("peak %d blocks, want 5", got/blockBytes)
	}
}

// TestBoundHoldsWithProbabilityEpsilon is the evidence that ε means what it
// says: for batches of requests with chat lengths, the bound is exceeded by
// the real future peak about as often as ε says, and is not far above it.
func TestBoundHoldsWithProbabilityEpsilon(t *testing.T) {
	short := func(rng *rand.Rand) int { return 192 + rng.IntN(129) }
	mixed := func(rng *rand.Rand) int { // the workload: 90 % ≈256, 10 % ≈4000
		if rng.IntN(10) == 0 {
			return 3500 + rng.IntN(1001)
		}
		return short(rng)
	}
	for _, tc := range []struct {
		name       string
		n          int
		fresh      bool
		prompt     func(*rand.Rand) int
		eps        float64
		trials     int
		raceTrials int     // under the race detector, if fewer
		minRatio   float64 // mean of real peak / bound must be above
	}{
		{"100 fresh, short prompts", 100, true, short, 1e-2, 2000, 0, 0.75},
		{"100 running, short prompts", 100, false, short, 1e-2, 2000, 0, 0.75},
		{"100 running, mixed prompts", 100, false, mixed, 1e-2, 2000, 0, 0.75},
		{"100 running, ε = 1e-3", 100, false, short, 1e-3, 10000, 2000, 0.75},
		{"20 running (few items)", 20, false, short, 1e-2, 2000, 0, 0.6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if raceEnabled && tc.raceTrials > 0 {
				tc.trials = tc.raceTrials
			}
			maxExceed := int(math.Ceil(1.5 * tc.eps * float64(tc.trials)))
			rng := rand.New(rand.NewPCG(10, uint64(tc.n)))
			z := predict.Z(tc.eps)
			mean, variance := make([]float64, predict.GridLen), make([]float64, predict.GridLen)
			diff := make([]int64, chatCap+1)
			var l *predict.Lengths
			exceeded := 0
			var sumRatio, minRatio, sumSaved float64 = 0, math.Inf(1), 0
			for trial := range tc.trials {
				if trial%relearnEach == 0 {
					l = learnChat(t, rng)
				}
				batch := draw(rng, tc.n, tc.fresh, tc.prompt, l)
				clear(mean)
				clear(variance)
				var worst int64
				for _, r := range batch {
					r.it.AddTo(mean, variance)
					worst += r.it.Final()
				}
				bound, _ := predict.Bound(mean, variance, z)
				real := float64(realPeak(batch, diff))
				if real > bound {
					exceeded++
				}
				ratio := real / bound
				sumRatio += ratio
				minRatio = min(minRatio, ratio)
				sumSaved += bound / float64(worst)
			}
			meanRatio := sumRatio / float64(tc.trials)
			t.Logf("ε %g, z %.3f: real peak > bound in %d of %d batches (ε·trials = %.0f); real/bound mean %.3f, min %.3f; bound/worst case %.3f",
				tc.eps, z, exceeded, tc.trials, tc.eps*float64(tc.trials), meanRatio, minRatio, sumSaved/float64(tc.trials))
			if exceeded > maxExceed {
				t.Errorf("bound exceeded in %d batches, want at most %d (1.5 × ε·trials)", exceeded, maxExceed)
			}
			if meanRatio < tc.minRatio {
				t.Errorf("mean real/bound %.3f, want above %.2f: the bound is too conservative", meanRatio, tc.minRatio)
			}
		})
	}
}
