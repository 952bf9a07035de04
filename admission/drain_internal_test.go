package admission

import (
	"testing"
	"time"
)

func TestDrainWindowSlides(t *testing.T) {
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return base.Add(d) }
	d := newDrainEstimator(base, 10*time.Second) // buckets of 1s
	if total, _ := d.sample(base); total != 0 {
		t.Fatalf("cold estimator has %d", total)
	}
	if _, ok := d.wait(base, 10); ok {
		t.Fatal("cold estimator claims a measurement")
	}
	d.record(at(500*time.Millisecond), 100)
	for _, tc := range []struct {
		now   time.Duration
		total int64
		span  time.Duration
	}{
		{500 * time.Millisecond, 100, time.Second}, // never less than one bucket
		{5 * time.Second, 100, 5 * time.Second},    // since the start
		{9500 * time.Millisecond, 100, 9500 * time.Millisecond},
		{10 * time.Second, 0, 9 * time.Second}, // bucket 0 has left the window
	} {
		total, span := d.sample(at(tc.now))
		if total != tc.total || span != tc.span {
			t.Errorf("at %v: %d over %v, want %d over %v", tc.now, total, span, tc.total, tc.span)
		}
	}
	d.record(at(11200*time.Millisecond), 50)
	d.record(at(11900*time.Millisecond), 25)
	d.record(at(15*time.Second), 5)
	total, span := d.sample(at(12500 * time.Millisecond))
	if total != 75 || span != 9500*time.Millisecond {
		t.Fatalf("after reuse of slots: %d over %v", total, span)
	}
	// Bucket 11 is reused by bucket 21 (same slot): the old bytes must go.
	d.record(at(21*time.Second), 7)
	if total, _ := d.sample(at(21 * time.Second)); total != 12 { // 15s:5 and 21s:7
		t.Fatalf("slot reuse kept stale bytes: %d", total)
	}
	if w, ok := d.wait(at(21*time.Second), 12); !ok || w != 9*time.Second {
		t.Fatalf("wait for 12 at 12 per 9s = %v %v", w, ok)
	}
	if w, ok := d.wait(at(21*time.Second), 0); !ok || w != 0 {
		t.Fatalf("wait for nothing = %v %v", w, ok)
	}
	if w, ok := d.wait(at(21*time.Second), 1<<62); !ok || w <= 0 {
		t.Fatalf("huge need must saturate, got %v %v", w, ok)
	}
	if r := d.rate(at(21 * time.Second)); r != 12.0/9 {
		t.Fatalf("rate %v", r)
	}
}

func TestWaitRoundsUp(t *testing.T) {
	base := time.Unix(0, 0)
	d := newDrainEstimator(base, 10*time.Second)
	d.record(base, 3)
	// 1 byte at 3 per second: 333333333.33ns, rounded up.
	if w, _ := d.wait(base, 1); w != 333333334 {
		t.Fatalf("wait %d", w)
	}
}

type fixedClock struct{ now time.Time }

func (c *fixedClock) Now() time.Time                        { return c.now }
func (c *fixedClock) AfterFunc(time.Duration, func()) Timer { panic("not used") }

// A run of releases read later is spread evenly over the time from its
// first release to the read.
func TestDrainRunIsSpreadOverItsSpan(t *testing.T) {
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := &fixedClock{now: base.Add(500 * time.Millisecond)}
	d := newDrainEstimator(base, 10*time.Second)
	d.add(100, clock) // stamps the run at 0.5s
	clock.now = base.Add(3 * time.Second)
	d.add(200, clock) // joins the run, no reading
	total, span := d.sample(base.Add(3500 * time.Millisecond))
	if total != 300 || span != 3500*time.Millisecond {
		t.Fatalf("%d over %v", total, span)
	}
	// 300 over [0.5s, 3.5s]: 50 in bucket 0, 100 in 1 and 2, 50 in 3; once
	// bucket 0 leaves the window, 250 remain.
	if total, _ := d.sample(base.Add(10200 * time.Millisecond)); total != 250 {
		t.Fatalf("after bucket 0 left: %d, want 250", total)
	}

	// A run longer than the window keeps only the window's share: the
	// uniform rate survives.
	d = newDrainEstimator(base, 10*time.Second)
	clock.now = base
	d.add(3000, clock)
	total, span = d.sample(base.Add(30 * time.Second))
	if total != 900 || span != 9*time.Second {
		t.Fatalf("long run: %d over %v, want 900 over 9s", total, span)
	}
	// A run read at the instant it began goes into that instant's bucket.
	clock.now = base.Add(31 * time.Second)
	d.add(7, clock)
	if total, _ := d.sample(clock.now); total != 7+800 {
		t.Fatalf("zero-length run: %d", total)
	}
}
