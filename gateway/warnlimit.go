package gateway

import (
	"sync"
	"time"
)

// warnLimit lets one warning of a kind through per interval and counts
// those it holds back, so that a backend whose /tokenize fails on every
// request under load says so once a minute with a count, not once per
// request. The counter metric beside each warning counts every one.
type warnLimit struct {
	every time.Duration

	mu         sync.Mutex // guards the fields below
	last       time.Time
	suppressed int
}

// allow says whether a warning at now goes out, and how many were held
// back since the last that did.
func (w *warnLimit) allow(now time.Time) (ok bool, suppressed int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.last.IsZero() && now.Sub(w.last) < w.every {
		w.suppressed++
		return false, 0
	}
	w.last, suppressed, w.suppressed = now, w.suppressed, 0
	return true, suppressed
}
