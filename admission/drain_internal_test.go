package admission

import (
	"testing"
	"time"
)

type fixedClock struct{ now time.Time }

func (c *fixedClock) Now() time.Time                        { return c.now }
func (c *fixedClock) AfterFunc(time.Duration, func()) Timer { panic("not used") }

var drainBase = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return drainBase.Add(d) }

// The rate is charge per second of busy time: a GPU idle for a minute
// whose burst drains 300 in its first 2 s of work drains 150/s, not 300 over
// the whole window (30/s), which would shed the burst for nothing.
func TestDrainRateIsPerBusySecond(t *testing.T) {
	clock := &fixedClock{now: at(0)}
	d := newDrainEstimator(at(0), 10*time.Second)
	clock.now = at(60 * time.Second)
	d.busy(clock.now, true)
	for i := range 3 {
		clock.now = at(60*time.Second + time.Duration(i+1)*time.Second*2/3)
		d.add(100, clock)
	}
	rate, n := d.rate(at(62 * time.Second))
	if n != 3 || rate != 150 {
		t.Fatalf("rate %v over %d releases, want 150 over 3", rate, n)
	}
	// Idle again: the idle time does not dilute the rate.
	d.busy(at(62*time.Second), false)
	if rate, _ := d.rate(at(66 * time.Second)); rate != 150 {
		t.Fatalf("after 4 s idle: rate %v, want 150", rate)
	}
	// Busy again without releases: now it does count.
	d.busy(at(66*time.Second), true)
	if rate, _ := d.rate(at(68 * time.Second)); rate != 75 {
		t.Fatalf("2 s more busy: rate %v, want 300/4s", rate)
	}
}

func TestDrainWindowSlides(t *testing.T) {
	clock := &fixedClock{}
	d := newDrainEstimator(at(0), 10*time.Second) // buckets of 1s
	if total, n, busy := d.sample(at(0)); total != 0 || n != 0 || busy != 0 {
		t.Fatalf("cold estimator has %d over %d releases, %v", total, n, busy)
	}
	d.busy(at(0), true)
	clock.now = at(500 * time.Millisecond)
	d.add(100, clock)
	for _, tc := range []struct {
		now   time.Duration
		total int64
		busy  time.Duration
	}{
		{500 * time.Millisecond, 100, 500 * time.Millisecond},
		{5 * time.Second, 100, 5 * time.Second},
		{10 * time.Second, 0, 9 * time.Second}, // bucket 0 has left the window
		{25 * time.Second, 0, 9 * time.Second},
	} {
		total, _, busy := d.sample(at(tc.now))
		if total != tc.total || busy != tc.busy {
			t.Errorf("at %v: %d over %v, want %d over %v", tc.now, total, busy, tc.total, tc.busy)
		}
	}
	// A release reuses a slot last used by an older bucket: the old counts go.
	clock.now = at(31 * time.Second)
	d.add(7, clock)
	if total, n, _ := d.sample(at(31 * time.Second)); total != 7 || n != 1 {
		t.Fatalf("slot reuse kept stale counts: %d over %d releases", total, n)
	}
}

// The first release of a spell does not read as an infinite rate.
func TestDrainRateFloorsTheBusyTime(t *testing.T) {
	clock := &fixedClock{now: at(0)}
	d := newDrainEstimator(at(0), 10*time.Second)
	d.busy(at(0), true)
	d.add(50, clock)
	if rate, n := d.rate(at(0)); n != 1 || rate != 500 { // 50 over the 100 ms floor
		t.Fatalf("rate %v over %d", rate, n)
	}
}

// A run of releases read later is spread evenly over the time from its
// first release to the read.
func TestDrainRunIsSpreadOverItsSpan(t *testing.T) {
	clock := &fixedClock{now: at(500 * time.Millisecond)}
	d := newDrainEstimator(at(0), 10*time.Second)
	d.busy(at(0), true)
	d.add(100, clock) // stamps the run at 0.5s
	clock.now = at(3 * time.Second)
	d.add(200, clock) // joins the run, no reading
	if total, n, _ := d.sample(at(3500 * time.Millisecond)); total != 300 || n != 2 {
		t.Fatalf("%d over %d releases", total, n)
	}
	// 300 over [0.5s, 3.5s]: 50 in bucket 0, 100 in 1 and 2, 50 in 3; once
	// bucket 0 leaves the window, 250 remain.
	if total, _, _ := d.sample(at(10200 * time.Millisecond)); total != 250 {
		t.Fatalf("after bucket 0 left: %d, want 250", total)
	}
}
