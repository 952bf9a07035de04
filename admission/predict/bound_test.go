package predict_test

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/admission/predict"
)

func TestBound(t *testing.T) {
	inf := math.Inf(1)
	for _, tc := range []struct {
		name           string
		mean, variance []float64
		z              float64
		peak           float64
		k              int
	}{
		{"mean alone at z = 0", []float64{1, 5, 3}, []float64{0, 0, 9}, 0, 5, 1},
		{"variance moves the peak", []float64{1, 5, 3}, []float64{0, 0, 9}, 1, 6, 2},
		{"z scales the deviation", []float64{1, 5, 3}, []float64{0, 0, 9}, 3, 12, 2},
		{"first of equal peaks", []float64{4, 2, 4}, []float64{0, 4, 0}, 1, 4, 0},
		{"negative variance is rounding, read as 0", []float64{2, 1}, []float64{-1e-9, -4}, 10, 2, 0},
		{"deterministic curve under an infinite z", []float64{2, 7, 3}, []float64{0, 0, 0}, inf, 7, 1},
		{"empty", nil, nil, 1, 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peak, k := predict.Bound(tc.mean, tc.variance, tc.z)
			if peak != tc.peak || k != tc.k {
				t.Fatalf("Bound = %v at %d, want %v at %d", peak, k, tc.peak, tc.k)
			}
		})
	}
}

func TestBoundOfACurve(t *testing.T) {
	// The two-point item of TestAddToTwoPointDistribution: at z = 1 the bound
	// is mean + sd = (t+1)/2 + (t+1)/2 = t+1 from step 2, largest at step 5.
	mean, variance := curve(predict.Item{Cap: 100, Seqs: 1, BlockTokens: 1, BlockBytes: 1, Lengths: twoPoint(t)})
	if peak, k := predict.Bound(mean, variance, 1); peak != 6 || k != 5 {
		t.Fatalf("Bound = %v at %d, want 6 at 5", peak, k)
	}
	if peak, k := predict.Bound(mean, variance, 0); peak != 3 || k != 5 {
		t.Fatalf("Bound at z = 0 is %v at %d, want the mean's peak 3 at 5", peak, k)
	}
}

func TestZ(t *testing.T) {
	for _, tc := range []struct {
		eps, want float64
	}{
		{0.5, 0},
		{1e-4, 3.7190164854556804},
		{1e-2, 2.3263478740408408},
		{0.025, 1.959963984540054},
		{0.8413447460685429, -1}, // Φ(1): a bound below the mean
	} {
		if got := predict.Z(tc.eps); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Z(%v) = %v, want %v", tc.eps, got, tc.want)
		}
	}
	if z := predict.Z(0); !math.IsInf(z, 1) {
		t.Errorf("Z(0) = %v, want +Inf", z)
	}
	for _, eps := range []float64{-0.1, 1.5, math.NaN()} {
		if z := predict.Z(eps); !math.IsNaN(z) {
			t.Errorf("Z(%v) = %v, want NaN", eps, z)
		}
	}
}
