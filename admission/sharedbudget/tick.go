package sharedbudget

import (
	"context"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// ticker paces a periodic loop on a Clock, as a time.Ticker would on the
// wall clock: steps are due every period from its start; a step that
// overruns its period is followed by the next at once, and the ticks it
// overran are dropped. On a manual clock a test steps the loop by
// advancing time.
type ticker struct {
	clock  admission.Clock
	period time.Duration
	next   time.Time
}

func newTicker(c admission.Clock, period time.Duration) *ticker {
	return &ticker{clock: c, period: period, next: c.Now().Add(period)}
}

// wait returns true at the next tick, false once ctx ends.
func (t *ticker) wait(ctx context.Context) bool {
	if ctx.Err() != nil {
		return false
	}
	now := t.clock.Now()
	if !now.Before(t.next) {
		// Overran: this tick is due already, the next is the first one
		// after now.
		t.next = t.next.Add((now.Sub(t.next)/t.period + 1) * t.period)
		return true
	}
	fired := make(chan struct{})
	timer := t.clock.AfterFunc(t.next.Sub(now), func() { close(fired) })
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-fired:
		t.next = t.next.Add(t.period)
		return true
	}
}
