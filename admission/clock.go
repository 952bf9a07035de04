package admission

import "time"

// Clock is the budget's source of time: queue deadlines, waits and the drain
// window are all measured with it, so a test can drive them by hand (see
// package admissiontest).
type Clock interface {
	Now() time.Time
	// AfterFunc runs f in its own goroutine once d has passed. The budget
	// calls it with its mutex held, so f must not be run synchronously.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc. Stop reports whether it stopped the timer
// before f started; the budget never relies on the answer, because f itself
// rechecks the waiter's state under the budget's mutex.
type Timer interface{ Stop() bool }

// SystemClock is the wall clock: time.Now and time.AfterFunc.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
