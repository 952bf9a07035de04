package sharedbudget

import (
	"math"
	"testing"
)

func TestIndependentBatches(t *testing.T) {
	for _, tc := range []struct {
		board []int64
		level int64
		want  float64
	}{
		{nil, -1, 1},
		{[]int64{100}, -1, 1},
		{[]int64{100, 100, 100}, -1, 3},
		{[]int64{300, 500, 100}, 100, 3}, // all cut at the level: three equal batches
		{[]int64{900, 100}, -1, 1.6},     // (30+10)²/1000
		{[]int64{1000, 0, -5}, -1, 1},    // idle entries run nothing
	} {
		if got := independentBatches(atLevel(tc.board, tc.level)); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("independentBatches(%v at level %d) = %v, want %v", tc.board, tc.level, got, tc.want)
		}
	}
}

// A head larger than the fair level gets a turn, the oldest first: its
// replica's level is what it needs, the others share the rest in whole
// chunks, rounded down, so that the levels fit the budget; a head that fits
// at the fair level, or could never fit, gets none.
func TestTurnLevel(t *testing.T) {
	busy := func(r string) boardEntry { return boardEntry{replica: r, demand: 1000, held: 330} }
	big := func(r string, held, since int64) boardEntry {
		return boardEntry{replica: r, demand: 1000, held: held, charge: 400, since: since}
	}
	for _, tc := range []struct {
		name  string
		board []boardEntry
		want  map[string]int64
		turn  string
	}{
		{"they fit: no level", []boardEntry{{replica: "a", demand: 300}, {replica: "b", demand: 300}}, map[string]int64{"a": -1, "b": -1}, ""},
		{"saturated, no big head: the fair level", []boardEntry{busy("a"), busy("b"), busy("c")}, map[string]int64{"a": 340, "b": 340, "c": 340}, ""},
		{"a small head fits at the level", []boardEntry{{replica: "a", demand: 1000, held: 200, charge: 100, since: 5}, busy("b"), busy("c")},
			map[string]int64{"a": 340, "b": 340, "c": 340}, ""},
		{"a big head: its turn", []boardEntry{big("a", 100, 5), busy("b"), busy("c")}, map[string]int64{"a": 500, "b": 240, "c": 240}, "a"},
		{"two big heads: the older first", []boardEntry{big("a", 100, 9), big("b", 0, 5), busy("c")}, map[string]int64{"a": 300, "b": 400, "c": 300}, "b"},
		{"a head past the budget never gets one", []boardEntry{{replica: "a", demand: 2000, charge: 1500, since: 1}, busy("b")},
			map[string]int64{"a": 500, "b": 500}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sum int64
			for r, want := range tc.want {
				got, turn := turnLevel(1000, 20, tc.board, r)
				if got != want || turn != tc.turn {
					t.Errorf("%s: level %d, turn %q; want %d, %q", r, got, turn, want, tc.turn)
				}
				sum += max(got, 0)
			}
			if tc.turn != "" && sum > 1000 {
				t.Errorf("levels sum to %d during a turn, over the budget", sum)
			}
		})
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
