package sharedbudget

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/admissiontest"
)

// The periodic loops' ticker runs on the injected clock, as a time.Ticker
// would on the wall clock: a tick per period, one tick at once after an
// overrun and the missed ones dropped, nothing before a tick is due.
func TestTickerOnTheInjectedClock(t *testing.T) {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := admissiontest.NewClock(start)
	tk := newTicker(clock, 10*time.Second)
	ctx := context.Background()

	// wait returns whether a tick came, and the time it ran at.
	wait := func(advance time.Duration) (bool, time.Duration) {
		t.Helper()
		got := make(chan bool, 1)
		go func() { got <- tk.wait(ctx) }()
		clock.Advance(advance) // before or after wait arms its timer: the tick is due either way
		return <-got, clock.Now().Sub(start)
	}
	for _, step := range []struct {
		advance time.Duration
		at      time.Duration
		next    time.Duration // the tick after it
	}{
		{10 * time.Second, 10 * time.Second, 20 * time.Second},
		{10 * time.Second, 20 * time.Second, 30 * time.Second},
		{35 * time.Second, 55 * time.Second, 60 * time.Second}, // overran three ticks: one now, the next on the grid
		{5 * time.Second, 60 * time.Second, 70 * time.Second},
	} {
		ok, at := wait(step.advance)
		if !ok || at != step.at || tk.next.Sub(start) != step.next {
			t.Fatalf("tick at %v: %v, next %v; want a tick at %v, next %v", at, ok, tk.next.Sub(start), step.at, step.next)
		}
	}

	// Not due: it waits until its context ends, and says no tick came.
	cctx, cancel := context.WithCancel(ctx)
	got := make(chan bool, 1)
	go func() { got <- tk.wait(cctx) }()
	clock.Advance(9 * time.Second)
	cancel()
	if <-got {
		t.Fatal("a tick came before it was due")
	}
	if tk.wait(cctx) {
		t.Fatal("a tick came after the context ended")
	}
}
