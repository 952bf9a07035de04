package admission

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The promises of a queue agree with a plain list of them: what is
// outstanding at a time is the charge of those due after it, and no more
// than maxPromises are kept.
func TestPromisesAgreeWithAList(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	start := time.Unix(0, 0)
	var ps promises
	var list []promise
	capped := 0
	now := start
	for i := range maxPromises + 1000 {
		now = now.Add(time.Duration(r.IntN(3)) * time.Millisecond)
		var want int64
		kept := list[:0]
		for _, p := range list {
			if p.due.After(now) {
				kept, want = append(kept, p), want+p.charge
			}
		}
		list = kept
		if got := ps.outstanding(now); got != want {
			t.Fatalf("step %d: outstanding %d, the list's %d", i, got, want)
		}
		p := promise{due: now.Add(time.Duration(r.IntN(20000)) * time.Millisecond), charge: int64(1 + r.IntN(100))}
		ps.add(p)
		if len(list) < maxPromises {
			list = append(list, p)
		} else {
			capped++
		}
		if len(ps.h) != len(list) {
			t.Fatalf("step %d: %d promises kept, the list %d", i, len(ps.h), len(list))
		}
	}
	if capped == 0 {
		t.Fatalf("the cap was never reached")
	}
}
