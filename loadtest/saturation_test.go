package loadtest

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

// feed gives the detector one completion every 1/tput seconds for secs
// seconds, each with the TTFT ttft(x) at its time x.
func feed(d *SaturationDetector, secs, tput float64, ttft func(x float64) float64) {
	for x := 0.0; x < secs; x += 1 / tput {
		d.ObserveTTFT(at(x), time.Duration(ttft(x)*float64(time.Second)))
		d.ObserveCompletion(at(x + 0.01))
	}
}

func TestSaturationDetector(t *testing.T) {
	cfg := SaturationConfig{MinDuration: 10 * time.Second, MinSamples: 20, Window: 60 * time.Second}
	wobble := func(x float64) float64 { // deterministic noise of ±10%
		return []float64{1, 1.1, 0.9, 1.05, 0.95}[int(x*10)%5]
	}
	for _, tc := range []struct {
		name      string
		secs      float64
		tput      func(x float64) float64 // completions per second at time x
		ttft      func(x float64) float64
		checkAt   float64
		saturated bool
	}{
		{name: "steady queue", secs: 30, tput: func(float64) float64 { return 10 },
			ttft: func(x float64) float64 { return 0.8 * wobble(x) }, checkAt: 30},
		{name: "runaway TTFT at flat throughput", secs: 30, tput: func(float64) float64 { return 10 },
			ttft: func(x float64) float64 { return (0.2 + 0.2*x) * wobble(x) }, checkAt: 30, saturated: true},
		{name: "too early to tell", secs: 8, tput: func(float64) float64 { return 10 },
			ttft: func(x float64) float64 { return 0.2 + 0.5*x }, checkAt: 8},
		{name: "TTFT rising but throughput rising with it (ramp-up)", secs: 30,
			tput: func(x float64) float64 { return 2 + x }, ttft: func(x float64) float64 { return 0.2 + 0.2*x }, checkAt: 30},
		{name: "TTFT rises but stays small", secs: 30, tput: func(float64) float64 { return 10 },
			ttft: func(x float64) float64 { return 0.01 + 0.005*x }, checkAt: 30},
		{name: "TTFT rising slowly (less than double)", secs: 30, tput: func(float64) float64 { return 10 },
			ttft: func(x float64) float64 { return 2 + 0.02*x }, checkAt: 30},
		{name: "old runaway left the window", secs: 100, tput: func(float64) float64 { return 10 },
			ttft: func(x float64) float64 { return min(0.2+0.2*x, 6) * wobble(x) }, checkAt: 100},
	} {
		d := NewSaturationDetector(cfg, t0)
		for x := 0.0; x < tc.secs; {
			r := tc.tput(x)
			d.ObserveTTFT(at(x), time.Duration(tc.ttft(x)*float64(time.Second)))
			d.ObserveCompletion(at(x + 0.01))
			x += 1 / r
		}
		v := d.Check(at(tc.checkAt))
		if v.Saturated != tc.saturated {
			t.Errorf("%s: saturated = %v, want %v (%+v)", tc.name, v.Saturated, tc.saturated, v)
		}
		if v.Saturated && !strings.Contains(v.Why, "TTFT rose from") {
			t.Errorf("%s: why = %q", tc.name, v.Why)
		}
	}
}

func TestSaturationVerdictFigures(t *testing.T) {
	d := NewSaturationDetector(SaturationConfig{}, t0)
	feed(d, 20, 10, func(x float64) float64 { return 0.5 + 0.25*x }) // exact line
	v := d.Check(at(20))
	if !v.Saturated {
		t.Fatalf("not saturated: %+v", v)
	}
	if !near(v.SlopeSPerS, 0.25, 1e-9) || !near(v.TTFTStartS, 0.5, 1e-9) || !near(v.Throughput, 10, 0.5) {
		t.Errorf("figures: %+v", v)
	}
}
