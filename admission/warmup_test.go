package admission_test

import (
	"testing"

	"github.com/kvgate/kvgate/admission"
)

// The first warmup_samples sequences to finish are the shortest of those
// admitted: the long ones are still running. When the warm-up ends, each
// sequence still running teaches the predictor a censored sample at the
// length it has reached, so that what it learned is not short exactly
// where the memory is.
func TestWarmUpEndsWithWhatStillRuns(t *testing.T) {
	const warmup = 20
	for _, tc := range []struct {
		name    string
		running int
		// What a new request counts for once the queue predicts (its worst
		// case is 65 blocks of 16 bytes): with no survivor, what 50-token
		// outputs hold; with ten survivors past 500 tokens, a third of the
		// samples say nothing past 500, so a third of its worst case at
		// least.
		minCharge, maxCharge int64
	}{
		{"no survivor", 0, 1, 10 * 16},
		{"ten survivors at 500 tokens", 10, 1040 / 3, 1040},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, predicted(1<<30, warmup))
			var long []*admission.Ticket
			for range tc.running {
				tk := f.acquire(chat(16, 1024))
				tk.Progress(0, 500)
				long = append(long, tk)
			}
			f.teach(warmup, 50) // the warm-up ends with the last of them
			if st := f.b.Stats().Queues[0]; st.Samples != float64(warmup+tc.running) || !st.Predicting {
				t.Fatalf("after the warm-up: %v samples (predicting %v), want %d", st.Samples, st.Predicting, warmup+tc.running)
			}
			before := f.b.Stats().GPUs[0].Charge
			tk := f.acquire(chat(16, 1024))
			charge := f.b.Stats().GPUs[0].Charge - before
			if charge < tc.minCharge || charge > tc.maxCharge {
				t.Fatalf("a new request counts for %d bytes, want [%d, %d]", charge, tc.minCharge, tc.maxCharge)
			}
			tk.Release()
			for _, tk := range long {
				tk.Release()
			}
			f.state(0, 0)
		})
	}
}

// A request admitted during the warm-up is forecast once the queue
// predicts, but takes no part in the change detector: it was picked for
// having run long, so it crosses its mark far more often than the mark
// says however right the forecast is. Counted, the warm-up's survivors
// tripped the detector at once, and the queue went back to its worst case
// and started learning over, every time.
func TestWarmUpSurvivorsDoNotTripTheDetector(t *testing.T) {
	// Ten survivors of 210: the 0.9 quantile is known (50 tokens), and ten
	// crossings in a row are past the detector's threshold.
	const warmup = 200
	f := newFixture(t, predicted(1<<30, warmup))
	var long []*admission.Ticket
	for range 10 {
		tk := f.acquire(chat(16, 1024))
		tk.Progress(0, 100)
		long = append(long, tk)
	}
	f.teach(warmup, 50) // the warm-up ends with the last of them
	probe := f.acquire(chat(16, 1024))
	for _, tk := range long {
		tk.Progress(0, 400) // far past the 0.9 quantile of what finished
	}
	st := f.b.Stats()
	if st.Trips[admission.TripDrift] != 0 || !st.Queues[0].Predicting {
		t.Fatalf("drift trips %d, predicting %v: the warm-up's survivors tripped the detector", st.Trips[admission.TripDrift], st.Queues[0].Predicting)
	}
	for _, tk := range long {
		tk.Done(0, 400, false)
	}
	probe.Release()
	f.state(0, 0)
}
