package predict

import (
	"fmt"
	"math"
	"slices"
)

// Snapshot is a Lengths' counts as plain data, to be serialised (JSON) and
// merged into the Lengths of another gateway replica that serves the same
// model. Counts are decayed sample weights, not integers.
type Snapshot struct {
	// Layout names the bucket scheme and MaxLen; counts merge only into a
	// Lengths with the same layout.
	Layout string `json:"layout"`
	// Ended[b] is the weight of sequences that stopped on their own with a
	// length in bucket b.
	Ended []float64 `json:"ended"`
	// Capped[b] is the weight of sequences stopped by their cap in bucket b.
	Capped []float64 `json:"capped"`
}

// Layout is the id of l's bucket layout (scheme and MaxLen), as a Snapshot
// carries it.
func (l *Lengths) Layout() string {
	return fmt.Sprintf("%s/fine%d/oct%d/max%d", layoutVersion, fineLen, perOctave, l.maxLen)
}

// Snapshot copies l's counts.
func (l *Lengths) Snapshot() Snapshot {
	return Snapshot{Layout: l.Layout(), Ended: slices.Clone(l.ended), Capped: slices.Clone(l.capped)}
}

// Merge adds another replica's counts to l, then decays as Observe does (so
// the merged total stays within 2×Window). It refuses, changing nothing, a
// snapshot of another layout, of the wrong length, or with a count that is
// negative, NaN or infinite.
func (l *Lengths) Merge(s Snapshot) error {
	if want := l.Layout(); s.Layout != want {
		return fmt.Errorf("predict: merge: snapshot layout %q differs from %q", s.Layout, want)
	}
	if len(s.Ended) != len(l.ended) || len(s.Capped) != len(l.capped) {
		return fmt.Errorf("predict: merge: snapshot has %d ended and %d capped buckets, want %d of each", len(s.Ended), len(s.Capped), len(l.ended))
	}
	for b := range s.Ended {
		for _, c := range [2]float64{s.Ended[b], s.Capped[b]} {
			if !(c >= 0) || math.IsInf(c, 1) {
				return fmt.Errorf("predict: merge: snapshot bucket %d (lengths %d..%d) has count %v; counts must be finite and >= 0", b, bucketLow(b), l.last[b], c)
			}
		}
	}
	for b := range s.Ended {
		if c := s.Ended[b] + s.Capped[b]; c > 0 {
			l.ended[b] += s.Ended[b]
			l.capped[b] += s.Capped[b]
			l.total += c
			l.top = max(l.top, b)
		}
	}
	l.decay()
	l.recompute()
	return nil
}
