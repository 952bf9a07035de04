package predict_test

import (
	"testing"

	"github.com/kvgate/kvgate/admission/predict"
)

// A tally's snapshot, merged into an empty Lengths, is the Lengths that
// observed the same samples; taking it empties the tally.
func TestTallyIsObserveDeferred(t *testing.T) {
	cfg := predict.LengthsConfig{MaxLen: 4096}
	for _, tc := range []struct {
		name    string
		samples []sample
	}{
		{"none", nil},
		{"fine buckets", ended(0, 1, 5, 31)},
		{"wide buckets and caps", []sample{{40, false}, {200, true}, {1000, false}, {4096, true}}},
		{"past MaxLen counts as capped at MaxLen", []sample{{9000, false}, {3, false}}},
		{"negative lengths are ignored", []sample{{-1, false}, {7, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := learn(t, cfg, tc.samples...)
			tally := learn(t, cfg).NewTally()
			for _, s := range tc.samples {
				tally.Observe(s.n, s.capped)
			}
			if tally.Samples() != want.Samples() {
				t.Fatalf("tally counts %v samples, the Lengths %v", tally.Samples(), want.Samples())
			}
			snap := tally.Take()
			if snap.Layout != want.Layout() || tally.Layout() != want.Layout() {
				t.Fatalf("layout %q / %q, want %q", snap.Layout, tally.Layout(), want.Layout())
			}
			got := learn(t, cfg)
			if err := got.Merge(snap); err != nil {
				t.Fatal(err)
			}
			sameSurvival(t, want, got, 5000)
			if tally.Samples() != 0 {
				t.Fatalf("after Take the tally still counts %v", tally.Samples())
			}
			empty := tally.Take()
			for b := range empty.Ended {
				if empty.Ended[b] != 0 || empty.Capped[b] != 0 {
					t.Fatalf("the second Take has counts in bucket %d", b)
				}
			}
		})
	}
}
