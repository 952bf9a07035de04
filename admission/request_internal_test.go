package admission

import (
	"math"
	"testing"
)

// Sizes saturate at math.MaxInt64 instead of wrapping to a small or negative
// weight that would fit any budget: a request with absurd counts must weigh
// more than any budget, never less.
func TestGroupSizeSaturates(t *testing.T) {
	for _, tc := range []struct {
		name string
		g    Group
		want int64
	}{
		{"ordinary", Group{Prompt: 100, Cap: 28, Seqs: 2, BlockTokens: 16, BlockBytes: 1 << 20}, (6 + 2*2) << 20},
		{"huge cap", Group{Prompt: 10, Cap: math.MaxInt, Seqs: 1, BlockTokens: 16, BlockBytes: 1 << 20}, math.MaxInt64},
		{"huge prompt and cap", Group{Prompt: math.MaxInt, Cap: math.MaxInt, Seqs: 1, BlockTokens: 1, BlockBytes: 1}, math.MaxInt64},
		{"many sequences", Group{Prompt: 16, Cap: 1 << 40, Seqs: 1 << 30, BlockTokens: 16, BlockBytes: 2}, math.MaxInt64},
		{"huge blocks", Group{Prompt: 1, Cap: 1, Seqs: 1, BlockTokens: 16, BlockBytes: math.MaxInt64}, math.MaxInt64},
	} {
		if got := tc.g.final(); got != tc.want {
			t.Errorf("%s: final() = %d, want %d", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct{ a, b, sum, prod int64 }{
		{3, 4, 7, 12},
		{math.MaxInt64, 1, math.MaxInt64, math.MaxInt64},
		{math.MaxInt64 - 1, 1, math.MaxInt64, math.MaxInt64 - 1},
		{1 << 32, 1 << 32, 1 << 33, math.MaxInt64},
		{0, math.MaxInt64, math.MaxInt64, 0},
	} {
		if s, p := satAdd64(tc.a, tc.b), satMul(tc.a, tc.b); s != tc.sum || p != tc.prod {
			t.Errorf("satAdd64/satMul(%d, %d) = %d, %d; want %d, %d", tc.a, tc.b, s, p, tc.sum, tc.prod)
		}
	}
}
