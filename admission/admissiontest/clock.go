// Package admissiontest has helpers for tests of admission and of its
// callers: a manual Clock that moves only when told, an Observer that
// records every call, and a wait for a number of queued requests.
package admissiontest

import (
	"container/heap"
	"sync"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// Clock is a manual admission.Clock. Now stays put until Advance moves it;
// Advance fires the AfterFuncs that fall due, one at a time in deadline
// order (ties in creation order), each in its own goroutine, waiting for
// each to return before the next — so after Advance returns, every effect
// of the fired timers is visible, and tests are exact.
//
// A timer function may call Now and AfterFunc, and may Stop timers; it must
// not call Advance.
type Clock struct {
	advance sync.Mutex // serializes Advance

	mu     sync.Mutex // guards below
	now    time.Time
	seq    uint64
	timers timerHeap
}

var _ admission.Clock = (*Clock)(nil)

// NewClock returns a manual clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now is the clock's current reading.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f for Now()+d. With d <= 0 it runs f at once in its
// own goroutine, as time.AfterFunc does.
func (c *Clock) AfterFunc(d time.Duration, f func()) admission.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, f: f, when: c.now.Add(d), seq: c.seq, index: -1}
	c.seq++
	if d <= 0 {
		go f()
		return t
	}
	heap.Push(&c.timers, t)
	return t
}

// Advance moves the clock d forward, firing the timers due by then; while
// a timer's function runs, Now reads that timer's deadline.
func (c *Clock) Advance(d time.Duration) {
	c.advance.Lock()
	defer c.advance.Unlock()
	c.mu.Lock()
	target := c.now.Add(d)
	for len(c.timers) > 0 && !c.timers[0].when.After(target) {
		t := heap.Pop(&c.timers).(*timer)
		if t.when.After(c.now) {
			c.now = t.when
		}
		c.mu.Unlock()
		ran := make(chan struct{})
		go func() {
			defer close(ran)
			t.f()
		}()
		<-ran
		c.mu.Lock()
	}
	if target.After(c.now) {
		c.now = target
	}
	c.mu.Unlock()
}

// Pending is how many timers are scheduled and neither fired nor stopped.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

type timer struct {
	c     *Clock
	f     func()
	when  time.Time
	seq   uint64
	index int // in the heap; -1 once fired or stopped
}

// Stop cancels the timer; it reports whether the timer was still pending.
func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.c.timers, t.index)
	return true
}

type timerHeap []*timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].when.Equal(h[j].when) {
		return h[i].when.Before(h[j].when)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*timer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.index = -1
	*h = old[:len(old)-1]
	return t
}
