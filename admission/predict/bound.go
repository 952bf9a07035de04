package predict

import "math"

// Bound is the largest mean[k] + z·sqrt(max(variance[k], 0)) over the grid,
// and the first k where it is reached: the bound on the batch's future peak
// memory that holds with probability about 1 − ε for z = Z(ε). A zero
// variance adds nothing whatever z is (a deterministic curve with z = +Inf
// is its mean). The slices must have the same length; for empty ones Bound
// is (0, −1).
func Bound(mean, variance []float64, z float64) (peak float64, k int) {
	variance = variance[:len(mean)]
	k = -1
	for i, m := range mean {
		v := m
		if s := variance[i]; s > 0 {
			v += z * math.Sqrt(s)
		}
		if k < 0 || v > peak {
			peak, k = v, i
		}
	}
	if k < 0 {
		return 0, -1
	}
	return peak, k
}

// Z is the one-sided standard normal quantile Φ⁻¹(1 − ε): the number of
// standard deviations above the mean that a normal variable passes with
// probability ε. Z(0.5) = 0, Z(1e-4) ≈ 3.719, Z(0) = +Inf; ε outside [0, 1]
// (or NaN) gives NaN, which the caller's configuration check should have
// refused (the useful range is (0, 0.5)).
func Z(epsilon float64) float64 {
	return math.Sqrt2 * math.Erfcinv(2*epsilon)
}
