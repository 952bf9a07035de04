package admission

import (
	"math/rand/v2"
	"testing"
)

// The table agrees with a map under random holds and releases, with names
// drawn from a small set (long probe runs, deletions inside them) and
// patterned ones (a prompt family's names differ in their low bits only).
func TestBlockTableAgreesWithAMap(t *testing.T) {
	for _, names := range []struct {
		label string
		draw  func(r *rand.Rand) uint64
	}{
		{"random", func(r *rand.Rand) uint64 { return r.Uint64() % 3000 * 0x100000001b3 }},
		{"patterned", func(r *rand.Rand) uint64 { return uint64(r.IntN(8))<<32 | uint64(r.IntN(300)) }},
		{"zero and small", func(r *rand.Rand) uint64 { return uint64(r.IntN(40)) }},
	} {
		t.Run(names.label, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var tb blockTable
			want := map[uint64]int32{}
			for step := range 200000 {
				k := names.draw(r)
				if r.IntN(2) == 0 {
					if first := tb.inc(k); first != (want[k] == 0) {
						t.Fatalf("step %d: inc(%d) first %v, map held %d", step, k, first, want[k])
					}
					want[k]++
				} else {
					prev := want[k]
					if last := tb.dec(k); last != (prev == 1) {
						t.Fatalf("step %d: dec(%d) last %v, map held %d", step, k, last, prev)
					}
					if prev > 1 {
						want[k]--
					} else {
						delete(want, k)
					}
				}
				if step%5000 == 0 {
					if tb.n != len(want) {
						t.Fatalf("step %d: %d names, map %d", step, tb.n, len(want))
					}
					for k, n := range want {
						if got := tb.get(k); got != n {
							t.Fatalf("step %d: get(%d) = %d, map %d", step, k, got, n)
						}
					}
				}
			}
		})
	}
}
