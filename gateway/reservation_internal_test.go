package gateway

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/kvbudget"
)

// A reservation's worst case is admission's weight of its shape, and
// saturates instead of wrapping into a weight small enough to fit a
// budget: counts the parser lets through (each below the context length)
// times many prompts and sequences, or a layout with huge blocks, weigh
// math.MaxInt64 and are refused as too large.
func TestReservationWeight(t *testing.T) {
	l := kvbudget.KVLayout{BlockSize: 16, BytesPerBlock: 2 << 20}
	for _, tc := range []struct {
		name          string
		layout        kvbudget.KVLayout
		prompts, outs []int
		seqs          int
		want          int64
	}{
		{"ordinary", l, []int{100}, []int{28}, 2, 10 * (2 << 20)},
		{"huge output", l, []int{10}, []int{math.MaxInt}, 1, math.MaxInt64},
		{"many sequences of huge outputs", l, []int{10, 10}, []int{1 << 50, 1 << 50}, 1 << 20, math.MaxInt64},
		{"huge blocks", kvbudget.KVLayout{BlockSize: 16, BytesPerBlock: math.MaxInt64 / 2}, []int{16}, []int{32}, 1, math.MaxInt64},
		// A prompt that fills the context leaves no output; admission still
		// weighs one token a sequence (its cap is at least 1), and so does
		// the figure a refusal quotes: a block more each, past a full one.
		{"prompt fills the context", l, []int{32}, []int{0}, 2, 4 * (2 << 20)},
		{"prompt fills the context, one sequence", l, []int{31}, []int{0}, 1, 2 * (2 << 20)},
	} {
		r := newReservation(tc.layout, tc.prompts, tc.outs, tc.seqs, tc.seqs, nil)
		if got := r.weight(); got != tc.want {
			t.Errorf("%s: weight() = %d, want %d", tc.name, got, tc.want)
		}
	}
}
