package loadtest

import (
	"fmt"
	"time"
)

// SaturationConfig tunes the over-saturation detector. Zero fields take the
// defaults given.
type SaturationConfig struct {
	// MinDuration: no verdict before the step has run this long. Default 10s.
	MinDuration time.Duration
	// MinSamples: TTFT samples the window must hold. Default 20.
	MinSamples int
	// Window: only the most recent Window of the step is judged, so a step
	// that was fine for ten minutes and then ran away is still caught.
	// Default 60s.
	Window time.Duration
	// Bucket: throughput is counted in buckets this wide. Default 1s.
	Bucket time.Duration
	// Confidence: one-sided confidence that the TTFT slope is positive.
	// Default 0.95.
	Confidence float64
	// MinRise: across the window the fitted TTFT must grow by at least this
	// fraction of its value at the window's start. Default 1 (it doubles).
	MinRise float64
	// MinTTFT: and the fitted TTFT at the window's end must be at least
	// this; a queue of milliseconds is not running away. Default 500ms.
	MinTTFT time.Duration
	// FlatWithin: throughput counts as flat when its fitted rise across the
	// window is below this fraction of its mean (a falling throughput is
	// flat too: it is not keeping up). Default 0.2.
	FlatWithin float64
}

func (c SaturationConfig) withDefaults() SaturationConfig {
	if c.MinDuration <= 0 {
		c.MinDuration = 10 * time.Second
	}
	if c.MinSamples <= 0 {
		c.MinSamples = 20
	}
	if c.Window <= 0 {
		c.Window = 60 * time.Second
	}
	if c.Bucket <= 0 {
		c.Bucket = time.Second
	}
	if c.Confidence <= 0 || c.Confidence >= 1 {
		c.Confidence = 0.95
	}
	if c.MinRise <= 0 {
		c.MinRise = 1
	}
	if c.MinTTFT <= 0 {
		c.MinTTFT = 500 * time.Millisecond
	}
	if c.FlatWithin <= 0 {
		c.FlatWithin = 0.2
	}
	return c
}

// SaturationDetector decides whether a step's queue is running away: time to
// first token rising steadily (a least-squares slope whose one-sided
// confidence bound is above zero, growing by MinRise) while throughput is
// flat. In a closed loop that is the server queueing (or preempting) instead
// of serving; in an open loop it is arrivals outpacing the server. Either way
// more time at this level only measures a longer queue.
//
// It holds no clock: callers pass the time of each observation and of each
// check, so a test states the exact series and the exact verdict. It is not
// safe for concurrent use; the step runner serialises calls under its lock.
type SaturationDetector struct {
	cfg   SaturationConfig
	start time.Time
	ttftX []float64 // seconds since start of each first token
	ttftY []float64 // its TTFT, seconds
	done  []int     // completions per bucket since start
}

// NewSaturationDetector starts a detector for a step that began at start.
func NewSaturationDetector(cfg SaturationConfig, start time.Time) *SaturationDetector {
	return &SaturationDetector{cfg: cfg.withDefaults(), start: start}
}

// ObserveTTFT records a request whose first token arrived at at, ttft after
// it was sent.
func (d *SaturationDetector) ObserveTTFT(at time.Time, ttft time.Duration) {
	d.ttftX = append(d.ttftX, at.Sub(d.start).Seconds())
	d.ttftY = append(d.ttftY, ttft.Seconds())
}

// ObserveCompletion records a request that finished at at.
func (d *SaturationDetector) ObserveCompletion(at time.Time) {
	k := int(at.Sub(d.start) / d.cfg.Bucket)
	if k < 0 {
		return
	}
	for len(d.done) <= k {
		d.done = append(d.done, 0)
	}
	d.done[k]++
}

// SaturationVerdict is a detector's finding at one moment.
type SaturationVerdict struct {
	Saturated bool `json:"saturated"`
	// TTFT fitted at the start and end of the window, seconds; slope in
	// seconds of TTFT per second of step.
	TTFTStartS float64 `json:"ttft_start_s"`
	TTFTEndS   float64 `json:"ttft_end_s"`
	SlopeSPerS float64 `json:"ttft_slope_s_per_s"`
	// Throughput in the window, completions per second, and its fitted
	// change across the window.
	Throughput       float64 `json:"throughput_per_s"`
	ThroughputChange float64 `json:"throughput_change_per_s"`
	WindowS          float64 `json:"window_s"`
	Samples          int     `json:"samples"`
	Why              string  `json:"why,omitempty"`
}

// Check judges the window ending at now.
func (d *SaturationDetector) Check(now time.Time) SaturationVerdict {
	c := d.cfg
	elapsed := now.Sub(d.start)
	var v SaturationVerdict
	if elapsed < c.MinDuration {
		return v
	}
	from := max(elapsed-c.Window, 0).Seconds()
	// Drop samples that left the window; they never come back.
	i := 0
	for i < len(d.ttftX) && d.ttftX[i] < from {
		i++
	}
	d.ttftX, d.ttftY = d.ttftX[i:], d.ttftY[i:]
	v.Samples = len(d.ttftX)
	if v.Samples < c.MinSamples {
		return v
	}
	f := fitLine(d.ttftX, d.ttftY)
	if !f.ok {
		return v
	}
	x0, x1 := d.ttftX[0], d.ttftX[len(d.ttftX)-1]
	for _, x := range d.ttftX {
		x0, x1 = min(x0, x), max(x1, x)
	}
	v.TTFTStartS, v.TTFTEndS, v.SlopeSPerS, v.WindowS = f.at(x0), f.at(x1), f.b, x1-x0
	lower := f.b - studentT(c.Confidence, float64(f.n-2))*f.se
	rising := lower > 0 && f.b*(x1-x0) >= c.MinRise*max(f.at(x0), 1e-3) && f.at(x1) >= c.MinTTFT.Seconds()
	if !rising {
		return v
	}
	// Throughput over whole buckets inside the window only: the bucket in
	// progress is short by construction.
	full := int(elapsed / c.Bucket)
	first := int(from / c.Bucket.Seconds())
	if from > float64(first)*c.Bucket.Seconds() {
		first++
	}
	var bx, by []float64
	for k := first; k < full; k++ {
		n := 0
		if k < len(d.done) {
			n = d.done[k]
		}
		bx = append(bx, (float64(k)+0.5)*c.Bucket.Seconds())
		by = append(by, float64(n)/c.Bucket.Seconds())
	}
	tf := fitLine(bx, by)
	if !tf.ok || len(bx) < 4 {
		return v
	}
	var mean float64
	for _, y := range by {
		mean += y
	}
	mean /= float64(len(by))
	v.Throughput = mean
	v.ThroughputChange = tf.b * (bx[len(bx)-1] - bx[0])
	if v.ThroughputChange >= c.FlatWithin*mean {
		return v // throughput still climbing: the queue is being served
	}
	v.Saturated = true
	v.Why = fmt.Sprintf("over-saturated: TTFT rose from %s to %s over %.0f s while throughput stayed near %.2f req/s",
		fmtSeconds(v.TTFTStartS), fmtSeconds(v.TTFTEndS), v.WindowS, mean)
	return v
}

// fmtSeconds prints a duration in seconds the way the report does: ms below
// one second, seconds above.
func fmtSeconds(s float64) string {
	if s < 1 {
		return fmt.Sprintf("%.0f ms", max(s, 0)*1000)
	}
	return fmt.Sprintf("%.2f s", s)
}
