package sim

import (
	"math"
	"strings"
	"testing"
)

func TestParseLengthDist(t *testing.T) {
	for _, s := range []string{"", "max", "fixed:10", "uniform:1-100", "uniform:5-5", "normal:200,50", "lognormal:150,0.6"} {
		if _, err := parseLengthDist(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"fixed", "want fixed:N"},
		{"fixed:0", ">= 1"},
		{"fixed:2.5", "whole number"},
		{"uniform:10-5", "1 <= A <= B"},
		{"uniform:0-5", "1 <= A <= B"},
		{"uniform:5", `separated by "-"`},
		{"normal:0,1", "MEAN"},
		{"normal:10", `separated by ","`},
		{"lognormal:x,1", "not a non-negative number"},
		{"poisson:3", "unknown kind"},
		{"fixed:-3", "non-negative"},
		{"fixed:NaN", "non-negative"},
	} {
		_, err := parseLengthDist(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.want)
		}
	}
}

func TestLengthDistDraws(t *testing.T) {
	const n = 4000
	tests := []struct {
		spec     string
		max      int
		lo, hi   int
		mean     float64
		meanSlop float64
	}{
		{"", 77, 77, 77, 77, 0},
		{"fixed:30", 100, 30, 30, 30, 0},
		{"fixed:300", 100, 100, 100, 100, 0}, // capped by max_tokens
		{"uniform:10-20", 100, 10, 20, 15, 0.5},
		{"normal:100,10", 1000, 40, 160, 100, 2},
		{"lognormal:100,0.5", 10000, 1, 10000, 100 * math.Exp(0.125), 6},
	}
	for _, tc := range tests {
		d, err := parseLengthDist(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		sum := 0
		seen := map[int]bool{}
		for k := range uint64(n) {
			v := d.draw(mix(k), tc.max)
			if v < tc.lo || v > tc.hi || v < 1 || v > tc.max {
				t.Fatalf("%s: draw %d outside [%d, %d]", tc.spec, v, tc.lo, tc.hi)
			}
			if v != d.draw(mix(k), tc.max) {
				t.Fatalf("%s: not deterministic", tc.spec)
			}
			sum += v
			seen[v] = true
		}
		if mean := float64(sum) / n; math.Abs(mean-tc.mean) > tc.meanSlop {
			t.Errorf("%s: mean %.2f, want %.2f ± %.1f", tc.spec, mean, tc.mean, tc.meanSlop)
		}
		if tc.spec == "uniform:10-20" && len(seen) != 11 {
			t.Errorf("uniform:10-20 drew %d distinct values, want all 11", len(seen))
		}
	}
}
