package predict_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/admission/predict"
)

// benchLengths is a Lengths for a 128k-context model that has learned the
// chat workload: its bucket count is what a production gateway has.
func benchLengths(b *testing.B) *predict.Lengths {
	l := learn(b, predict.LengthsConfig{MaxLen: 131072})
	rng := rand.New(rand.NewPCG(1, 1))
	for range predict.DefaultWindow {
		n := chatLength(rng)
		l.Observe(min(n, chatCap), n >= chatCap)
	}
	return l
}

func BenchmarkObserve(b *testing.B) {
	l := benchLengths(b)
	rng := rand.New(rand.NewPCG(2, 2))
	lengths := make([]int, 1024)
	for i := range lengths {
		lengths[i] = min(chatLength(rng), chatCap)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		n := lengths[i%len(lengths)]
		l.Observe(n, n == chatCap)
		i++
	}
}

func BenchmarkSurvival(b *testing.B) {
	l := benchLengths(b)
	b.ReportAllocs()
	x, sink := 0, 0.0
	for b.Loop() {
		sink += l.Survival(x)
		x = (x + 37) % 2048
	}
	_ = sink
}

// BenchmarkAddTo is one item's contribution: a chat request halfway through
// its median length, with the cap of the chat workload.
func BenchmarkAddTo(b *testing.B) {
	for _, bc := range []struct {
		name string
		cap  int
	}{{"cap=1024", chatCap}, {"cap=128k", 131072 - 300}} {
		b.Run(bc.name, func(b *testing.B) {
			it := predict.Item{Prompt: 256, Generated: 100, Cap: bc.cap, Seqs: 1, BlockTokens: blockTokens, BlockBytes: blockBytes, Lengths: benchLengths(b)}
			mean, variance := make([]float64, predict.GridLen), make([]float64, predict.GridLen)
			b.ReportAllocs()
			for b.Loop() {
				it.AddTo(mean, variance)
			}
		})
	}
}

func BenchmarkBound(b *testing.B) {
	mean, variance := make([]float64, predict.GridLen), make([]float64, predict.GridLen)
	rng := rand.New(rand.NewPCG(3, 3))
	l := benchLengths(b)
	for range 100 {
		g := rng.IntN(500)
		predict.Item{Prompt: 256, Generated: g, Cap: chatCap, Seqs: 1, BlockTokens: blockTokens, BlockBytes: blockBytes, Lengths: l}.AddTo(mean, variance)
	}
	z := predict.Z(1e-4)
	b.ReportAllocs()
	for b.Loop() {
		predict.Bound(mean, variance, z)
	}
}
