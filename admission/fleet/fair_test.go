package fleet

import (
	"math"
	"testing"
)

func TestIndependentBatches(t *testing.T) {
	for _, tc := range []struct {
		board []string
		level int64
		want  float64
	}{
		{nil, -1, 1},
		{[]string{"100"}, -1, 1},
		{[]string{"100", "100", "100"}, -1, 3},
		{[]string{"300", "500", "100"}, 100, 3},   // all cut at the level: three equal batches
		{[]string{"900", "100"}, -1, 1.6},         // (30+10)²/1000
		{[]string{"1000", "0", "x", "-5"}, -1, 1}, // idle and unreadable entries run nothing
	} {
		if got := independentBatches(demandsAt(tc.board, tc.level)); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("independentBatches(%v at level %d) = %v, want %v", tc.board, tc.level, got, tc.want)
		}
	}
}

func TestFairLevel(t *testing.T) {
	for _, tc := range []struct {
		budget  int64
		demands []int64
		want    int64
	}{
		{100, nil, -1},
		{100, []int64{30, 70}, -1},                // they fit
		{100, []int64{200}, 100},                  // one replica: the whole budget
		{100, []int64{200, 200}, 50},              // even halves
		{100, []int64{10, 200, 200}, 45},          // the small one keeps its 10, the rest split 90
		{100, []int64{10, 20, 200}, 70},           // only one above the level
		{100, []int64{40, 40, 40}, 33},            // 3 × 33 ≤ 100
		{1 << 40, []int64{1 << 41, 1}, 1<<40 - 1}, // large numbers
	} {
		if got := fairLevel(tc.budget, tc.demands); got != tc.want {
			t.Errorf("fairLevel(%d, %v) = %d, want %d", tc.budget, tc.demands, got, tc.want)
		}
		if lv := fairLevel(tc.budget, tc.demands); lv >= 0 {
			var sum int64
			for _, d := range tc.demands {
				sum += min(d, lv)
			}
			if sum > tc.budget {
				t.Errorf("fairLevel(%d, %v) = %d: Σ min(d, L) = %d over the budget", tc.budget, tc.demands, lv, sum)
			}
		}
	}
}
