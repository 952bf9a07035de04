package predict

import "slices"

// Tally counts finished sequences in the bucket layout of a Lengths and
// estimates nothing: it is how one gateway replica collects the samples it
// has seen since it last shared them, to hand them out as a Snapshot that
// the other replicas Merge. Its counts never decay (a tally is taken and
// emptied long before that would matter) and it costs an increment per
// sample, where Observe recomputes the whole survival curve.
//
// Not safe for concurrent use: the caller locks.
type Tally struct {
	layout string
	maxLen int
	total  float64
	ended  []float64
	capped []float64
}

// NewTally returns an empty tally in l's layout.
func (l *Lengths) NewTally() *Tally {
	return &Tally{layout: l.Layout(), maxLen: l.maxLen, ended: make([]float64, len(l.ended)), capped: make([]float64, len(l.capped))}
}

// Layout is the layout id its snapshots carry (Lengths.Layout).
func (t *Tally) Layout() string { return t.layout }

// Observe counts one finished sequence, as Lengths.Observe does.
func (t *Tally) Observe(n int, capped bool) {
	if n < 0 {
		return
	}
	if n > t.maxLen {
		n, capped = t.maxLen, true
	}
	if capped {
		t.capped[bucketOf(n)]++
	} else {
		t.ended[bucketOf(n)]++
	}
	t.total++
}

// Samples is how many sequences it has counted since it was last taken.
func (t *Tally) Samples() float64 { return t.total }

// Take returns the counts as a Snapshot and empties the tally.
func (t *Tally) Take() Snapshot {
	s := Snapshot{Layout: t.layout, Ended: slices.Clone(t.ended), Capped: slices.Clone(t.capped)}
	clear(t.ended)
	clear(t.capped)
	t.total = 0
	return s
}
