package loadtest

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// stepClock advances by step on every reading: the n-th call to Now returns
// t0 + n·step. Code that reads the clock a fixed number of times per event
// (the SSE reader reads it once a line) then measures exact durations.
type stepClock struct {
	step time.Duration
	n    atomic.Int64
}

func (c *stepClock) Now() time.Time { return t0.Add(time.Duration(c.n.Add(1)) * c.step) }

// After never fires: tests using stepClock set no timeouts.
func (c *stepClock) After(time.Duration) <-chan time.Time { return make(chan time.Time) }

// manualClock stands still until the test moves it. After registers a
// waiter that fires when the clock reaches its deadline.
type manualClock struct {
	mu      sync.Mutex
	cond    *sync.Cond
	now     time.Time
	waiters []manualWaiter
}

type manualWaiter struct {
	at time.Time
	ch chan time.Time
}

func newManualClock() *manualClock {
	c := &manualClock{now: t0}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, manualWaiter{at: c.now.Add(d), ch: ch})
	c.cond.Broadcast()
	return ch
}

// waitWaiters blocks until at least n waiters are pending.
func (c *manualClock) waitWaiters(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.waiters) < n {
		c.cond.Wait()
	}
}

// advanceIfWaiting advances to the next deadline if any waiter is pending.
func (c *manualClock) advanceIfWaiting() bool {
	c.mu.Lock()
	n := len(c.waiters)
	c.mu.Unlock()
	if n == 0 {
		return false
	}
	c.advanceToNext()
	return true
}

// advanceToNext moves the clock to the earliest pending deadline, fires
// every waiter due by then, and returns the new time.
func (c *manualClock) advanceToNext() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.waiters) == 0 {
		return c.now
	}
	next := slices.MinFunc(c.waiters, func(a, b manualWaiter) int { return a.at.Compare(b.at) }).at
	if next.After(c.now) {
		c.now = next
	}
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
	return c.now
}

var (
	_ Clock = (*stepClock)(nil)
	_ Clock = (*manualClock)(nil)
)
