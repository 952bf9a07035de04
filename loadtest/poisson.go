package loadtest

import (
	"math/rand/v2"
	"time"
)

// Poisson generates the arrival times of an open-loop Poisson process:
// independent exponential gaps of mean 1/rate. Arrivals are offsets from the
// start of the step, accumulated exactly, so a scheduler that sleeps until
// start+offset does not drift however late each wake-up is.
type Poisson struct {
	rate float64
	r    *rand.Rand
	at   float64 // seconds since start of the last arrival
}

// NewPoisson returns arrivals at rate per second drawn from r; rate must be
// positive.
func NewPoisson(rate float64, r *rand.Rand) *Poisson {
	return &Poisson{rate: rate, r: r}
}

// Next returns the offset of the next arrival from the start.
func (p *Poisson) Next() time.Duration {
	p.at += p.r.ExpFloat64() / p.rate
	return time.Duration(p.at * float64(time.Second))
}
