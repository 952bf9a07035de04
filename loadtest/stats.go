package loadtest

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 ≤ p ≤ 100) of sorted values by
// linear interpolation between closest ranks, the estimator NumPy uses by
// default and vLLM's benchmark_serving reports with: rank h = (n−1)·p/100,
// result = x[⌊h⌋] + (h−⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋]). It is NaN for no values.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 || math.IsNaN(p) {
		return math.NaN()
	}
	p = min(max(p, 0), 100)
	h := float64(n-1) * p / 100
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return sorted[n-1]
	}
	return sorted[lo] + (h-float64(lo))*(sorted[lo+1]-sorted[lo])
}

// Summary describes one latency distribution, in milliseconds.
type Summary struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	Min  float64 `json:"min"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// Summarize sorts ms in place and describes it. With no values every figure
// is zero and N is 0, so a JSON reader checks N before trusting the rest.
func Summarize(ms []float64) Summary {
	if len(ms) == 0 {
		return Summary{}
	}
	slices.Sort(ms)
	var sum float64
	for _, v := range ms {
		sum += v
	}
	return Summary{
		N: len(ms), Mean: sum / float64(len(ms)), Min: ms[0], Max: ms[len(ms)-1],
		P50: Percentile(ms, 50), P90: Percentile(ms, 90), P99: Percentile(ms, 99),
	}
}

// Rate is count events over window, per second; 0 for an empty window.
func Rate(count float64, window time.Duration) float64 {
	if window <= 0 {
		return 0
	}
	return count / window.Seconds()
}

// Wilson returns the Wilson score interval for successes out of n at the
// normal quantile z. Unlike the normal approximation it stays inside [0, 1]
// and does not collapse to a zero-width interval at 0 or n successes, which is
// exactly where an SLO-attainment judgement lives (99 of 100 met; 100 of 100).
// With n = 0 nothing is known and the interval is [0, 1].
func Wilson(successes, n int, z float64) (lo, hi float64) {
	if n <= 0 {
		return 0, 1
	}
	nf := float64(n)
	p := float64(successes) / nf
	z2 := z * z
	denom := 1 + z2/nf
	center := (p + z2/(2*nf)) / denom
	half := z / denom * math.Sqrt(p*(1-p)/nf+z2/(4*nf*nf))
	return max(0, center-half), min(1, center+half)
}

// NormalQuantile is the inverse of the standard normal CDF at p in (0, 1).
func NormalQuantile(p float64) float64 {
	return math.Sqrt2 * math.Erfinv(2*p-1)
}

// studentT is the p-quantile of Student's t with df degrees of freedom, by
// the Cornish–Fisher expansion around the normal quantile (Abramowitz &
// Stegun 26.7.5, three terms). For df ≥ 3 and p ≤ 0.99 it is within a few
// per cent, plenty for deciding whether a slope is clearly positive.
func studentT(p, df float64) float64 {
	z := NormalQuantile(p)
	if df <= 0 {
		return math.NaN()
	}
	z3, z5 := z*z*z, z*z*z*z*z
	return z + (z3+z)/(4*df) + (5*z5+16*z3+3*z)/(96*df*df) +
		(3*z5*z*z+19*z5+17*z3-15*z)/(384*df*df*df)
}

// linearFit is an ordinary least-squares line y = a + b·x with the standard
// error of b. ok is false with fewer than three points or no spread in x.
type linearFit struct {
	n        int
	a, b, se float64
	ok       bool
}

func fitLine(xs, ys []float64) linearFit {
	n := len(xs)
	if n < 3 || len(ys) != n {
		return linearFit{n: n}
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(n)
	my /= float64(n)
	var sxx, sxy, syy float64
	for i := range xs {
		dx, dy := xs[i]-mx, ys[i]-my
		sxx += dx * dx
		sxy += dx * dy
		syy += dy * dy
	}
	if sxx <= 0 {
		return linearFit{n: n}
	}
	b := sxy / sxx
	rss := max(syy-b*sxy, 0)
	se := math.Sqrt(rss / float64(n-2) / sxx)
	return linearFit{n: n, a: my - b*mx, b: b, se: se, ok: true}
}

// at is the fitted value at x.
func (f linearFit) at(x float64) float64 { return f.a + f.b*x }
