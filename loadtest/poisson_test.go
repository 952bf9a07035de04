package loadtest

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestPoissonMeanInterArrival(t *testing.T) {
	for _, rate := range []float64{0.5, 4, 250} {
		p := NewPoisson(rate, rand.New(rand.NewPCG(42, 1)))
		const n = 200_000
		var last, at time.Duration
		var sum, sumSq float64
		for range n {
			at = p.Next()
			gap := (at - last).Seconds()
			if gap < 0 {
				t.Fatalf("rate %g: arrivals went backwards", rate)
			}
			sum += gap
			sumSq += gap * gap
			last = at
		}
		mean := sum / n
		// Exponential gaps: mean 1/rate, and standard deviation 1/rate too.
		// The sample mean's standard error is (1/rate)/sqrt(n), 0.22%; allow 1%.
		if want := 1 / rate; math.Abs(mean-want) > 0.01*want {
			t.Errorf("rate %g: mean inter-arrival %g s, want %g s", rate, mean, want)
		}
		sd := math.Sqrt(sumSq/n - mean*mean)
		if want := 1 / rate; math.Abs(sd-want) > 0.02*want {
			t.Errorf("rate %g: inter-arrival sd %g s, want %g s (exponential)", rate, sd, want)
		}
		// Offsets accumulate exactly: the n-th arrival is the sum of the gaps.
		if math.Abs(at.Seconds()-sum) > 1e-6*sum {
			t.Errorf("rate %g: last arrival %s, sum of gaps %g s", rate, at, sum)
		}
	}
}

func TestPoissonRepeatsUnderSeed(t *testing.T) {
	a := NewPoisson(3, rand.New(rand.NewPCG(9, 9)))
	b := NewPoisson(3, rand.New(rand.NewPCG(9, 9)))
	for i := range 100 {
		if x, y := a.Next(), b.Next(); x != y {
			t.Fatalf("arrival %d: %s vs %s", i, x, y)
		}
	}
}
