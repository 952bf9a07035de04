package loadtest

import "time"

// Clock is the time source of everything whose behaviour depends on time:
// the open-loop arrival schedule, step deadlines, the metrics scrape and the
// progress ticker. Request latencies are read from it too, so a fake clock
// makes a whole step exact in a test.
type Clock interface {
	Now() time.Time
	// After is time.After: the channel receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

// SystemClock is the wall clock (monotonic readings included).
type SystemClock struct{}

// Now is time.Now.
func (SystemClock) Now() time.Time { return time.Now() }

// After is time.After.
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

var _ Clock = SystemClock{}
