package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
)

func oneClass(c admission.ClassConfig) admission.Config {
	if c.Name == "" {
		c.Name = "standard"
	}
	return admission.Config{Capacity: 10, Classes: []admission.ClassConfig{c}}
}

func TestQueueBounds(t *testing.T) {
	t.Run("count", func(t *testing.T) {
		f := newFixture(t, oneClass(admission.ClassConfig{MaxQueued: 2}))
		hold := f.acquire(std(10))
		a := f.enqueue(context.Background(), std(1))
		b := f.enqueue(context.Background(), std(1))
		re := f.reject(std(1), admission.ErrQueueFull)
		if re.RetryAfter != admission.DefaultDrainWindow || re.Capacity != 10 {
			t.Fatalf("queue full with no drain measurement: %+v", re)
		}
		hold.Release()
		f.admitted(a).Release()
		f.admitted(b).Release()
	})
	t.Run("bytes", func(t *testing.T) {
		f := newFixture(t, oneClass(admission.ClassConfig{MaxQueuedBytes: 10}))
		hold := f.acquire(std(10))
		a := f.enqueue(context.Background(), std(6))
		f.reject(std(5), admission.ErrQueueFull)
		b := f.enqueue(context.Background(), std(4))
		hold.Release()
		f.admitted(a).Release()
		f.admitted(b).Release()
	})
	t.Run("bytes default is 4x capacity", func(t *testing.T) {
		f := newFixture(t, oneClass(admission.ClassConfig{}))
		hold := f.acquire(std(10))
		var chs []<-chan result
		for range 4 {
			chs = append(chs, f.enqueue(context.Background(), std(10)))
		}
		f.reject(std(1), admission.ErrQueueFull)
		hold.Release()
		for _, ch := range chs {
			f.admitted(ch).Release()
		}
	})
	t.Run("bytes unbounded", func(t *testing.T) {
		f := newFixture(t, oneClass(admission.ClassConfig{MaxQueuedBytes: -1, MaxQueued: 6}))
		hold := f.acquire(std(10))
		var chs []<-chan result
		for range 6 {
			chs = append(chs, f.enqueue(context.Background(), std(10)))
		}
		f.reject(std(1), admission.ErrQueueFull) // the count bound still holds
		hold.Release()
		for _, ch := range chs {
			f.admitted(ch).Release()
		}
	})
	t.Run("never queue", func(t *testing.T) {
		f := newFixture(t, oneClass(admission.ClassConfig{MaxQueued: -1}))
		hold := f.acquire(std(6))
		f.reject(std(5), admission.ErrQueueFull)
		f.acquire(std(4)).Release()
		hold.Release()
	})
	t.Run("classes are bounded separately", func(t *testing.T) {
		f := newFixture(t, admission.Config{Capacity: 10, PressureThreshold: 1, Classes: []admission.ClassConfig{
			{Name: "hi", MaxQueued: 1}, {Name: "lo", MaxQueued: 1}}})
		hold := f.acquire(req("hi", "", 10))
		hi := f.enqueue(context.Background(), req("hi", "", 1))
		lo := f.enqueue(context.Background(), req("lo", "", 1))
		f.reject(req("hi", "", 1), admission.ErrQueueFull)
		f.reject(req("lo", "", 1), admission.ErrQueueFull)
		hold.Release()
		f.admitted(hi).Release()
		f.admitted(lo).Release()
	})
}

func TestQueueTimeout(t *testing.T) {
	f := newFixture(t, oneClass(admission.ClassConfig{QueueTimeout: 5 * time.Second}))
	hold := f.acquire(std(10))
	ch := f.enqueue(context.Background(), std(3))
	f.clock.Advance(5*time.Second - time.Nanosecond)
	f.state(10, 1)
	f.clock.Advance(time.Nanosecond)
	f.state(10, 0) // removed by the time Advance returns
	re := f.refused(ch, admission.ErrQueueTimeout)
	if re.Waited != 5*time.Second || re.Weight != 3 || re.RetryAfter != admission.DefaultDrainWindow {
		t.Fatalf("timed out: %+v", re)
	}
	hold.Release()
	if n := f.b.Stats().Rejected[admission.ReasonQueueTimeout]; n != 1 {
		t.Fatalf("queue_timeout counted %d times", n)
	}
}

func TestDeadlineIsTheEarlierOfRequestAndClass(t *testing.T) {
	f := newFixture(t, oneClass(admission.ClassConfig{QueueTimeout: 5 * time.Second}))
	hold := f.acquire(std(10))
	early := f.enqueue(context.Background(), admission.Request{Weight: 1, Deadline: t0.Add(2 * time.Second)})
	late := f.enqueue(context.Background(), admission.Request{Weight: 1, Deadline: t0.Add(time.Hour)})
	f.clock.Advance(2 * time.Second)
	if re := f.refused(early, admission.ErrQueueTimeout); re.Waited != 2*time.Second {
		t.Fatalf("request deadline: waited %v", re.Waited)
	}
	f.state(10, 1)
	f.clock.Advance(3 * time.Second)
	if re := f.refused(late, admission.ErrQueueTimeout); re.Waited != 5*time.Second {
		t.Fatalf("class timeout: waited %v", re.Waited)
	}
	hold.Release()
}

func TestNoClassTimeoutWaitsForTheRequestDeadlineOnly(t *testing.T) {
	f := newFixture(t, oneClass(admission.ClassConfig{QueueTimeout: -1}))
	hold := f.acquire(std(10))
	forever := f.enqueue(context.Background(), std(1))
	if f.clock.Pending() != 0 {
		t.Fatalf("a waiter with no deadline armed a timer")
	}
	f.clock.Advance(24 * time.Hour)
	f.state(10, 1)
	bounded := f.enqueue(context.Background(), admission.Request{Weight: 1, Deadline: f.clock.Now().Add(time.Minute)})
	f.clock.Advance(time.Minute)
	f.refused(bounded, admission.ErrQueueTimeout)
	hold.Release()
	f.admitted(forever).Release()
}

func TestDeadlineAlreadyPassed(t *testing.T) {
	f := newFixture(t, admission.Config{Capacity: 10})
	past := admission.Request{Weight: 5, Deadline: t0.Add(-time.Second)}
	tk := f.acquire(past) // fits: the deadline bounds waiting only
	f.acquire(std(5))
	f.reject(past, admission.ErrQueueTimeout)
	f.reject(admission.Request{Weight: 5, Deadline: t0}, admission.ErrQueueTimeout)
	tk.Release()
}

func TestTimedOutHeadOfLineWakesThoseBehind(t *testing.T) {
	f := newFixture(t, admission.Config{Capacity: 10})
	hold := f.acquire(std(5))
	big := f.enqueue(context.Background(), admission.Request{Weight: 8, Deadline: t0.Add(time.Second)})
	small := f.enqueue(context.Background(), std(5))
	f.clock.Advance(time.Second)
	f.refused(big, admission.ErrQueueTimeout)
	if tk := f.admitted(small); tk.Waited() != time.Second {
		t.Fatalf("small waited %v", tk.Waited())
	} else {
		tk.Release()
	}
	hold.Release()
	f.state(0, 0)
}

func TestOverloadedShedsSheddableAbovePressure(t *testing.T) {
	f := newFixture(t, admission.Config{Capacity: 10, PressureThreshold: 0.5})
	a := f.acquire(std(5))
	s := f.acquire(req("sheddable", "", 1)) // utilization 0.5 is not above 0.5
	re := f.reject(req("sheddable", "", 1), admission.ErrOverloaded)
	if re.RetryAfter != admission.DefaultDrainWindow || re.Capacity != 10 {
		t.Fatalf("overloaded: %+v", re)
	}
	f.acquire(std(1)).Release() // other classes still get in
	f.acquire(req("critical", "", 1)).Release()
	s.Release()
	f.acquire(req("sheddable", "", 1)).Release()
	a.Release()
}

// measured is a budget that has seen a release: at t0+2s, 50 of its 100
// were released, so the drain rate is 50 / 2s = 25/s and 50 is held (30 by
// tenant "t", 20 anonymous).
func measured(t *testing.T, cfg admission.Config) *fixture {
	t.Helper()
	cfg.Capacity = 100
	f := newFixture(t, cfg)
	a := f.acquire(req("", "x", 50))
	f.acquire(req("", "t", 30))
	f.acquire(std(20))
	f.clock.Advance(2 * time.Second)
	a.Release()
	if r := f.b.Stats().DrainRate; r != 25 {
		t.Fatalf("drain rate %v, want 25", r)
	}
	return f
}

func TestEarlyShedFromMeasuredDrainRate(t *testing.T) {
	now := t0.Add(2 * time.Second)
	t.Run("expected wait beyond deadline", func(t *testing.T) {
		f := measured(t, admission.Config{})
		// need 80 − 50 free = 30 at 25/s = 1.2s > 1s left.
		re := f.reject(admission.Request{Weight: 80, Deadline: now.Add(time.Second)}, admission.ErrQueueTimeout)
		if re.RetryAfter != 1200*time.Millisecond || re.Waited != 0 {
			t.Fatalf("early shed: %+v", re)
		}
	})
	t.Run("expected wait within deadline", func(t *testing.T) {
		f := measured(t, admission.Config{})
		ch := f.enqueue(context.Background(), admission.Request{Weight: 80, Deadline: now.Add(1200 * time.Millisecond)})
		f.clock.Advance(1200 * time.Millisecond)
		f.refused(ch, admission.ErrQueueTimeout)
	})
	t.Run("queued weight ahead counts", func(t *testing.T) {
		f := measured(t, admission.Config{})
		f.enqueue(context.Background(), std(80)) // class timeout 30s: queues
		// need 80 ahead + 10 − 50 free = 40 at 25/s = 1.6s.
		re := f.reject(admission.Request{Weight: 10, Deadline: now.Add(1500 * time.Millisecond)}, admission.ErrQueueTimeout)
		if re.RetryAfter != 1600*time.Millisecond {
			t.Fatalf("RetryAfter %v, want 1.6s", re.RetryAfter)
		}
		// A higher class does not wait for the standard queue: critical
		// lacks nothing, fits, and goes in.
		f.acquire(admission.Request{Weight: 10, Class: "critical", Deadline: now.Add(time.Millisecond)})
	})
	t.Run("tenant quota counts", func(t *testing.T) {
		f := measured(t, admission.Config{Tenants: []admission.TenantConfig{{Name: "t", Share: 0.35}}})
		// Fits globally; tenant t holds 30 of its 35: needs 30+35−35 = 30 → 1.2s.
		re := f.reject(admission.Request{Weight: 35, Tenant: "t", Deadline: now.Add(time.Second)}, admission.ErrQueueTimeout)
		if re.RetryAfter != 1200*time.Millisecond {
			t.Fatalf("RetryAfter %v, want 1.2s", re.RetryAfter)
		}
	})
}

func TestColdStartDoesNotShedEarly(t *testing.T) {
	f := newFixture(t, admission.Config{Capacity: 100})
	hold := f.acquire(std(100))
	// No release measured yet: a 1ns deadline still queues.
	ch := f.enqueue(context.Background(), admission.Request{Weight: 100, Deadline: t0.Add(time.Nanosecond)})
	f.clock.Advance(time.Nanosecond)
	f.refused(ch, admission.ErrQueueTimeout)
	hold.Release()
}

func TestRetryAfterValues(t *testing.T) {
	now := t0.Add(2 * time.Second)
	for _, tc := range []struct {
		name   string
		cfg    admission.Config
		r      admission.Request
		reason error
		want   time.Duration
	}{
		{"queue full", admission.Config{Classes: []admission.ClassConfig{{Name: "standard", MaxQueued: -1}}},
			std(90), admission.ErrQueueFull, 1600 * time.Millisecond}, // 40 at 25/s
		{"clamped to 1s", admission.Config{Classes: []admission.ClassConfig{{Name: "standard", MaxQueued: -1}}},
			std(55), admission.ErrQueueFull, time.Second}, // 5 at 25/s = 0.2s
		{"clamped to MaxRetryAfter", admission.Config{MaxRetryAfter: 1500 * time.Millisecond,
			Classes: []admission.ClassConfig{{Name: "standard", MaxQueued: -1}}},
			std(100), admission.ErrQueueFull, 1500 * time.Millisecond}, // 50 at 25/s = 2s
		{"overloaded", admission.Config{PressureThreshold: 0.1},
			req("sheddable", "", 1), admission.ErrOverloaded, 1600 * time.Millisecond}, // 50 − 10 = 40 at 25/s
		{"early timeout", admission.Config{},
			admission.Request{Weight: 100, Deadline: now.Add(time.Second)}, admission.ErrQueueTimeout, 2 * time.Second},
		{"too large", admission.Config{}, std(101), admission.ErrTooLarge, 0},
		{"tenant quota", admission.Config{DefaultTenantShare: 0.5}, std(51), admission.ErrTenantQuota, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := measured(t, tc.cfg)
			if re := f.reject(tc.r, tc.reason); re.RetryAfter != tc.want {
				t.Fatalf("RetryAfter %v, want %v", re.RetryAfter, tc.want)
			}
		})
	}
}

func TestRetryAfterOfATimeoutWhileQueued(t *testing.T) {
	f := measured(t, admission.Config{})
	ch := f.enqueue(context.Background(), admission.Request{Weight: 80, Deadline: t0.Add(7 * time.Second)})
	f.clock.Advance(5 * time.Second)
	// At t0+7s the window holds the 50 released at 2s over 7s: 50/7 per
	// second; the waiter lacks 80 − 50 = 30: 30 × 7s / 50 = 4.2s.
	re := f.refused(ch, admission.ErrQueueTimeout)
	if re.RetryAfter != 4200*time.Millisecond || re.Waited != 5*time.Second {
		t.Fatalf("timeout while queued: %+v", re)
	}
}

func TestRetryAfterWithoutMeasurementIsTheDrainWindowClamped(t *testing.T) {
	for _, tc := range []struct {
		window, max, want time.Duration
	}{
		{0, 0, 10 * time.Second},
		{3 * time.Second, 0, 3 * time.Second},
		{2 * time.Minute, 0, time.Minute},
		{100 * time.Millisecond, 0, time.Second},
		{2 * time.Minute, 90 * time.Second, 90 * time.Second},
	} {
		f := newFixture(t, admission.Config{Capacity: 10, DrainWindow: tc.window, MaxRetryAfter: tc.max,
			Classes: []admission.ClassConfig{{Name: "standard", MaxQueued: -1}}})
		hold := f.acquire(std(10))
		if re := f.reject(std(1), admission.ErrQueueFull); re.RetryAfter != tc.want {
			t.Errorf("window %v max %v: RetryAfter %v, want %v", tc.window, tc.max, re.RetryAfter, tc.want)
		}
		hold.Release()
	}
}
