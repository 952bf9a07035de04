package loadtest

import (
	"math"
	"testing"
	"time"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestPercentileHandComputed(t *testing.T) {
	// Ranks h = (n-1)·p/100 over sorted values, interpolated.
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		name string
		xs   []float64
		p    float64
		want float64
	}{
		{"single value", []float64{42}, 99, 42},
		{"median of even count", []float64{10, 20, 30, 40}, 50, 25}, // h=1.5
		{"median of odd count", []float64{1, 3, 100}, 50, 3},
		{"p0 is min", ten, 0, 1},
		{"p100 is max", ten, 100, 10},
		{"p90 of 1..10", ten, 90, 9.1},         // h=8.1: 9 + 0.1·1
		{"p99 of 1..10", ten, 99, 9.91},        // h=8.91
		{"p50 of 1..10", ten, 50, 5.5},         // h=4.5
		{"p25 of two", []float64{0, 8}, 25, 2}, // h=0.25
		{"p above 100 clamps", ten, 150, 10},
		{"negative p clamps", ten, -5, 1},
	} {
		if got := Percentile(tc.xs, tc.p); !near(got, tc.want, 1e-9) {
			t.Errorf("%s: Percentile(%v, %g) = %g, want %g", tc.name, tc.xs, tc.p, got, tc.want)
		}
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("Percentile of nothing should be NaN")
	}
}

func TestSummarize(t *testing.T) {
	// 100 values 1..100 in reverse: p50 = 50.5, p90 = 90.1, p99 = 99.01.
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i)
	}
	s := Summarize(xs)
	want := Summary{N: 100, Mean: 50.5, Min: 1, P50: 50.5, P90: 90.1, P99: 99.01, Max: 100}
	for _, f := range []struct {
		name      string
		got, want float64
	}{{"mean", s.Mean, want.Mean}, {"min", s.Min, want.Min}, {"p50", s.P50, want.P50},
		{"p90", s.P90, want.P90}, {"p99", s.P99, want.P99}, {"max", s.Max, want.Max}} {
		if !near(f.got, f.want, 1e-9) {
			t.Errorf("%s = %g, want %g", f.name, f.got, f.want)
		}
	}
	if s.N != 100 {
		t.Errorf("N = %d", s.N)
	}
	if z := Summarize(nil); z != (Summary{}) {
		t.Errorf("empty summary = %+v", z)
	}
}

func TestRate(t *testing.T) {
	for _, tc := range []struct {
		count  float64
		window time.Duration
		want   float64
	}{
		{40, 2 * time.Second, 20},
		{3, 1500 * time.Millisecond, 2},
		{12800, 4 * time.Second, 3200}, // output tokens/s
		{5, 0, 0},
		{5, -time.Second, 0},
	} {
		if got := Rate(tc.count, tc.window); !near(got, tc.want, 1e-9) {
			t.Errorf("Rate(%g, %s) = %g, want %g", tc.count, tc.window, got, tc.want)
		}
	}
}

func TestWilson(t *testing.T) {
	// Values from the closed form, worked by hand at z = 1.96.
	for _, tc := range []struct {
		k, n   int
		lo, hi float64
	}{
		{0, 10, 0, 0.27753},       // z²/(n+z²) = 3.8416/13.8416
		{10, 10, 0.72247, 1},      // mirror of the above
		{5, 10, 0.23659, 0.76341}, // centre 0.5, half 0.26341
		{99, 100, 0.94552, 0.99823},
		{100, 100, 0.96301, 1}, // n/(n+z²)
	} {
		lo, hi := Wilson(tc.k, tc.n, 1.96)
		if !near(lo, tc.lo, 5e-5) || !near(hi, tc.hi, 5e-5) {
			t.Errorf("Wilson(%d, %d) = [%.5f, %.5f], want [%.5f, %.5f]", tc.k, tc.n, lo, hi, tc.lo, tc.hi)
		}
	}
	if lo, hi := Wilson(0, 0, 1.96); lo != 0 || hi != 1 {
		t.Errorf("Wilson with no data = [%g, %g], want [0, 1]", lo, hi)
	}
}

func TestQuantiles(t *testing.T) {
	for _, tc := range []struct{ p, want float64 }{{0.5, 0}, {0.95, 1.644854}, {0.975, 1.959964}, {0.99, 2.326348}} {
		if got := NormalQuantile(tc.p); !near(got, tc.want, 1e-5) {
			t.Errorf("NormalQuantile(%g) = %g, want %g", tc.p, got, tc.want)
		}
	}
	// Student's t table values; the expansion is good to a few per cent.
	for _, tc := range []struct{ p, df, want float64 }{{0.975, 10, 2.228}, {0.95, 5, 2.015}, {0.95, 30, 1.697}, {0.975, 3, 3.182}} {
		if got := studentT(tc.p, tc.df); !near(got, tc.want, 0.03*tc.want) {
			t.Errorf("studentT(%g, %g) = %g, want %g", tc.p, tc.df, got, tc.want)
		}
	}
}

func TestFitLine(t *testing.T) {
	f := fitLine([]float64{0, 1, 2, 3}, []float64{1, 3, 5, 7}) // y = 1 + 2x exactly
	if !f.ok || !near(f.a, 1, 1e-12) || !near(f.b, 2, 1e-12) || !near(f.se, 0, 1e-9) {
		t.Errorf("exact line: %+v", f)
	}
	// y = 0,2,1,3 over x = 0..3: b = 0.8, a = 0.3, RSS = 1.8, se = sqrt(1.8/2/5).
	f = fitLine([]float64{0, 1, 2, 3}, []float64{0, 2, 1, 3})
	if !near(f.b, 0.8, 1e-12) || !near(f.a, 0.3, 1e-12) || !near(f.se, math.Sqrt(0.18), 1e-12) {
		t.Errorf("noisy line: %+v", f)
	}
	if fitLine([]float64{1, 1, 1}, []float64{1, 2, 3}).ok {
		t.Error("no spread in x must not fit")
	}
	if fitLine([]float64{1, 2}, []float64{1, 2}).ok {
		t.Error("two points must not fit (no error estimate)")
	}
}
