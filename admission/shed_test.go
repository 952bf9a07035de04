package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/internal/confval"
)

func oneClass(c admission.ClassConfig) admission.Config {
	if c.Name == "" {
		c.Name = "standard"
	}
	return oneGPU(10, admission.Config{Classes: []admission.ClassConfig{c}})
}

func TestQueueBounds(t *testing.T) {
	t.Run("count", func(t *testing.T) {
		f := newFixture(t, oneClass(admission.ClassConfig{ClassLimits: admission.ClassLimits{MaxQueued: 2}}))
		hold := f.acquire(std(10))
		a := f.enqueue(context.Background(), std(1))
		b := f.enqueue(context.Background(), std(1))
		re := f.reject(std(1), admission.ErrQueueFull)
		if re.RetryAfter < time.Second || re.RetryAfter >= 2*time.Second || re.Capacity != 10 {
			t.Fatalf("queue full with no drain measurement: %+v", re)
		}
		hold.Release()
		f.admitted(a).Release()
		f.admitted(b).Release()
	})
	t.Run("bytes", func(t *testing.T) {
		f := newFixture(t, oneClass(admission.ClassConfig{ClassLimits: admission.ClassLimits{MaxQueuedBytes: confval.Size{Bytes: 10}}}))
		hold := f.acquire(std(10))
		a := f.enqueue(context.Background(), std(6))
		f.reject(std(5), admission.ErrQueueFull)
		b := f.enqueue(context.Background(), std(4))
		hold.Release()
		f.admitted(a).Release()
		f.admitted(b).Release()
	})
	t.Run("bytes default is 16x capacity", func(t *testing.T) {
		f := newFixture(t, oneClass(admission.ClassConfig{}))
		hold := f.acquire(std(10))
		var chs []<-chan result
		for range 16 {
			chs = append(chs, f.enqueue(context.Background(), std(10)))
		}
		f.reject(std(1), admission.ErrQueueFull)
		hold.Release()
		for _, ch := range chs {
			f.admitted(ch).Release()
		}
	})
	t.Run("bytes unbounded", func(t *testing.T) {
		f := newFixture(t, oneClass(admission.ClassConfig{ClassLimits: admission.ClassLimits{MaxQueuedBytes: confval.Size{Bytes: -1}, MaxQueued: 6}}))
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
		f := newFixture(t, oneClass(admission.ClassConfig{ClassLimits: admission.ClassLimits{MaxQueued: -1}}))
		hold := f.acquire(std(6))
		f.reject(std(5), admission.ErrQueueFull)
		f.acquire(std(4)).Release()
		hold.Release()
	})
	t.Run("classes are bounded separately", func(t *testing.T) {
		f := newFixture(t, oneGPU(10, admission.Config{PressureThreshold: 1, Classes: []admission.ClassConfig{
			{Name: "hi", ClassLimits: admission.ClassLimits{MaxQueued: 1}}, {Name: "lo", ClassLimits: admission.ClassLimits{MaxQueued: 1}}}}))
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
	f := newFixture(t, oneClass(admission.ClassConfig{ClassLimits: admission.ClassLimits{QueueTimeout: confval.Duration{D: 5 * time.Second}}}))
	hold := f.acquire(std(10))
	ch := f.enqueue(context.Background(), std(3))
	f.clock.Advance(5*time.Second - time.Nanosecond)
	f.state(10, 1)
	f.clock.Advance(time.Nanosecond)
	f.state(10, 0) // removed by the time Advance returns
	re := f.refused(ch, admission.ErrQueueTimeout)
	if re.Waited != 5*time.Second || re.Weight != 3 || re.RetryAfter < time.Second || re.RetryAfter >= 2*time.Second {
		t.Fatalf("timed out: %+v", re)
	}
	hold.Release()
	if n := f.b.Stats().Rejected[admission.ReasonQueueTimeout]; n != 1 {
		t.Fatalf("queue_timeout counted %d times", n)
	}
}

func TestDeadlineIsTheEarlierOfRequestAndClass(t *testing.T) {
	f := newFixture(t, oneClass(admission.ClassConfig{ClassLimits: admission.ClassLimits{QueueTimeout: confval.Duration{D: 5 * time.Second}}}))
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
	f := newFixture(t, oneClass(admission.ClassConfig{ClassLimits: admission.ClassLimits{QueueTimeout: confval.Duration{D: -1}}}))
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
	f := newFixture(t, oneGPU(10, admission.Config{}))
	past := admission.Request{Weight: 5, Deadline: t0.Add(-time.Second)}
	tk := f.acquire(past) // fits: the deadline bounds waiting only
	f.acquire(std(5))
	f.reject(past, admission.ErrQueueTimeout)
	f.reject(admission.Request{Weight: 5, Deadline: t0}, admission.ErrQueueTimeout)
	tk.Release()
}

func TestTimedOutHeadOfLineWakesThoseBehind(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{}))
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
	f := newFixture(t, oneGPU(10, admission.Config{PressureThreshold: 0.5}))
	a := f.acquire(std(5))
	s := f.acquire(req("sheddable", "", 1)) // utilization 0.5 is not above 0.5
	re := f.reject(req("sheddable", "", 1), admission.ErrOverloaded)
	if re.RetryAfter < time.Second || re.RetryAfter >= 2*time.Second || re.Capacity != 10 {
		t.Fatalf("overloaded without a measurement: %+v, want Retry-After in [1s, 2s)", re)
	}
	f.acquire(std(1)).Release() // other classes still get in
	f.acquire(req("critical", "", 1)).Release()
	s.Release()
	f.acquire(req("sheddable", "", 1)).Release()
	a.Release()
}

// measured is a scheduler that has seen enough releases to trust its drain
// rate: from t0 to t0+2s the GPU was busy, and at t0+2s ten requests of 5
// were released, so the drain rate is 50 / 2s = 25/s; 50 is held (30 by
// tenant "t", 20 anonymous).
func measured(t *testing.T, cfg admission.Config) *fixture {
	t.Helper()
	f := newFixture(t, oneGPU(100, cfg))
	var xs []*admission.Ticket
	for range 10 {
		xs = append(xs, f.acquire(req("", "x", 5)))
	}
	f.acquire(req("", "t", 30))
	f.acquire(std(20))
	f.clock.Advance(2 * time.Second)
	for _, x := range xs {
		x.Release()
	}
	if r := f.b.Stats().DrainRate; r != 25 {
		t.Fatalf("drain rate %v, want 25", r)
	}
	return f
}

// within says d is want ± 10% (the jitter of Retry-After).
func within(d, want time.Duration) bool {
	return d >= want*9/10 && d <= want*11/10
}

func TestEarlyShedFromMeasuredDrainRate(t *testing.T) {
	now := t0.Add(2 * time.Second)
	t.Run("expected wait beyond deadline", func(t *testing.T) {
		f := measured(t, admission.Config{})
		// need 80 − 50 free = 30 at 25/s = 1.2s > 1s left.
		re := f.reject(admission.Request{Weight: 80, Deadline: now.Add(time.Second)}, admission.ErrQueueTimeout)
		if !within(re.RetryAfter, 1200*time.Millisecond) || re.Waited != 0 {
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
		f := measured(t, admission.Config{Backfill: admission.BackfillConfig{Enabled: new(false)}})
		f.enqueue(context.Background(), std(80)) // class timeout 30s: queues
		// need 80 ahead + 10 − 50 free = 40 at 25/s = 1.6s.
		re := f.reject(admission.Request{Weight: 10, Deadline: now.Add(1400 * time.Millisecond)}, admission.ErrQueueTimeout)
		if !within(re.RetryAfter, 1600*time.Millisecond) {
			t.Fatalf("RetryAfter %v, want 1.6s ± 10%%", re.RetryAfter)
		}
		// A higher class does not wait for the standard queue: critical
		// lacks nothing, fits, and goes in.
		f.acquire(admission.Request{Weight: 10, Class: "critical", Deadline: now.Add(time.Millisecond)})
	})
	t.Run("tenant quota counts", func(t *testing.T) {
		f := measured(t, admission.Config{Tenants: []admission.TenantConfig{{Name: "t", Share: 0.35}}})
		// Fits globally; tenant t holds 30 of its 35: needs 30+35−35 = 30 → 1.2s.
		re := f.reject(admission.Request{Weight: 35, Tenant: "t", Deadline: now.Add(time.Second)}, admission.ErrQueueTimeout)
		if !within(re.RetryAfter, 1200*time.Millisecond) {
			t.Fatalf("RetryAfter %v, want 1.2s ± 10%%", re.RetryAfter)
		}
	})
}

// Before the GPUs have seen enough releases, nothing is shed early: the
// first burst after a start (or a reload) must not be refused for a wait
// nobody has measured.
func TestColdStartDoesNotShedEarly(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{}))
	for range 3 { // a few releases are not enough to trust a rate
		f.acquire(std(1)).Release()
	}
	hold := f.acquire(std(100))
	// A 1ns deadline still queues.
	ch := f.enqueue(context.Background(), admission.Request{Weight: 100, Deadline: t0.Add(time.Nanosecond)})
	f.clock.Advance(time.Nanosecond)
	f.refused(ch, admission.ErrQueueTimeout)
	hold.Release()
}

// A burst of ten times what fits into an idle scheduler, with a deadline
// long enough for all of it: nothing is shed, early or late, whatever the
// drain rate measures as the burst goes through.
func TestBurstIntoIdleShedsNothing(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{Classes: []admission.ClassConfig{
		{Name: "standard", ClassLimits: admission.ClassLimits{QueueTimeout: confval.Duration{D: 60 * time.Second}}}}}))
	f.clock.Advance(time.Hour) // a long idle spell before the burst
	var running []*admission.Ticket
	var waiting []<-chan result
	for range 100 {
		if len(running) < 10 {
			running = append(running, f.acquire(std(10)))
			continue
		}
		waiting = append(waiting, f.enqueue(context.Background(), std(10)))
	}
	// Each request runs a second; as one finishes, the next starts.
	for len(running) > 0 {
		f.clock.Advance(100 * time.Millisecond)
		running[0].Release()
		running = running[1:]
		if len(waiting) > 0 {
			running = append(running, f.admitted(waiting[0]))
			waiting = waiting[1:]
		}
	}
	if s := f.b.Stats(); s.Admitted != 100 || s.Rejected["queue_timeout"] != 0 || s.Rejected["queue_full"] != 0 {
		t.Fatalf("burst: %+v", s.Stats)
	}
}

func TestRetryAfterValues(t *testing.T) {
	now := t0.Add(2 * time.Second)
	noQueue := []admission.ClassConfig{{Name: "standard", ClassLimits: admission.ClassLimits{MaxQueued: -1}}}
	for _, tc := range []struct {
		name   string
		cfg    admission.Config
		r      admission.Request
		reason error
		want   time.Duration
	}{
		{"queue full", admission.Config{Classes: noQueue}, std(90), admission.ErrQueueFull, 1600 * time.Millisecond}, // 40 at 25/s
		{"clamped to 1s", admission.Config{Classes: noQueue}, std(55), admission.ErrQueueFull, time.Second},          // 5 at 25/s = 0.2s
		{"clamped to MaxRetryAfter", admission.Config{MaxRetryAfter: 1500 * time.Millisecond, Classes: noQueue},
			std(100), admission.ErrQueueFull, 1500 * time.Millisecond}, // 50 at 25/s = 2s
		{"clamped to the queue timeout", admission.Config{Classes: []admission.ClassConfig{{Name: "standard", ClassLimits: admission.ClassLimits{MaxQueued: -1, QueueTimeout: confval.Duration{D: 1500 * time.Millisecond}}}}},
			std(100), admission.ErrQueueFull, 1500 * time.Millisecond},
		{"overloaded", admission.Config{PressureThreshold: 0.1},
			req("sheddable", "", 1), admission.ErrOverloaded, 1600 * time.Millisecond}, // 50 − 10 = 40 at 25/s
		{"early timeout", admission.Config{},
			admission.Request{Weight: 100, Deadline: now.Add(time.Second)}, admission.ErrQueueTimeout, 2 * time.Second},
		{"too large", admission.Config{}, std(101), admission.ErrTooLarge, 0},
		{"tenant quota", admission.Config{DefaultTenantShare: 0.5}, std(51), admission.ErrTenantQuota, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := measured(t, tc.cfg)
			re := f.reject(tc.r, tc.reason)
			clamped := tc.want == time.Second || tc.want == 1500*time.Millisecond
			switch {
			case tc.want == 0 && re.RetryAfter != 0,
				clamped && (re.RetryAfter < tc.want*9/10 || re.RetryAfter > tc.want),
				!clamped && tc.want != 0 && !within(re.RetryAfter, tc.want):
				t.Fatalf("RetryAfter %v, want %v", re.RetryAfter, tc.want)
			}
		})
	}
}

// Refusals of one burst are told to come back one after another: each
// counts the ones told before it as ahead of it, so the burst does not
// return as one wave and overflow the queue again.
func TestRetryAfterSpreadsABurst(t *testing.T) {
	f := measured(t, admission.Config{Classes: []admission.ClassConfig{{Name: "standard", ClassLimits: admission.ClassLimits{MaxQueued: -1}}}})
	// Each needs 60 − 50 free = 10, plus 60 for every refusal before it,
	// at 25/s: 0.4s (clamped to 1s), 2.8s, 5.2s, 7.6s.
	var last time.Duration
	for i, want := range []time.Duration{time.Second, 2800 * time.Millisecond, 5200 * time.Millisecond, 7600 * time.Millisecond} {
		re := f.reject(std(60), admission.ErrQueueFull)
		if (i == 0 && (re.RetryAfter < 900*time.Millisecond || re.RetryAfter > time.Second)) || (i > 0 && !within(re.RetryAfter, want)) {
			t.Fatalf("refusal %d: Retry-After %v, want %v ± 10%%", i, re.RetryAfter, want)
		}
		if re.RetryAfter <= last {
			t.Fatalf("refusal %d: Retry-After %v not after the previous %v", i, re.RetryAfter, last)
		}
		last = re.RetryAfter
	}
	// Once their time has come, they no longer count.
	f.clock.Advance(10 * time.Second)
	if re := f.reject(std(60), admission.ErrQueueFull); re.RetryAfter > 4*time.Second {
		t.Fatalf("after the promises fell due: Retry-After %v", re.RetryAfter)
	}
}

// A client that honours Retry-After comes back about when it can be
// admitted: within ±50% of the time the room it needs really frees.
func TestRetryAfterMatchesTheNextAdmission(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{Classes: []admission.ClassConfig{{Name: "standard", ClassLimits: admission.ClassLimits{MaxQueued: -1}}}}))
	// Ten requests of 1, each running 10 s, started a second apart: in
	// steady state one finishes every second.
	var running []*admission.Ticket
	for range 10 {
		running = append(running, f.acquire(std(1)))
		f.clock.Advance(time.Second)
	}
	for range 10 { // a steady state: one out, one in, every second
		running[0].Release()
		running = append(running[1:], f.acquire(std(1)))
		f.clock.Advance(time.Second)
	}
	// Full: a request of 6 needs six releases, the first of them now.
	re := f.reject(std(6), admission.ErrQueueFull)
	var next time.Duration
	for freed := 0; freed < 6; freed++ {
		running[0].Release()
		running = running[1:]
		if freed < 5 {
			f.clock.Advance(time.Second)
			next += time.Second
		}
	}
	f.acquire(std(6)).Release()
	if lo, hi := next/2, next*3/2; re.RetryAfter < lo || re.RetryAfter > hi {
		t.Fatalf("Retry-After %v; the room came %v later", re.RetryAfter, next)
	}
	for _, r := range running {
		r.Release()
	}
}

func TestRetryAfterOfATimeoutWhileQueued(t *testing.T) {
	f := measured(t, admission.Config{})
	ch := f.enqueue(context.Background(), admission.Request{Weight: 80, Deadline: t0.Add(7 * time.Second)})
	f.clock.Advance(5 * time.Second)
	// At t0+7s the window holds the 50 released at 2s over 7 s busy: 50/7
	// per second; the waiter lacks 80 − 50 = 30: 30 × 7s / 50 = 4.2s.
	re := f.refused(ch, admission.ErrQueueTimeout)
	if !within(re.RetryAfter, 4200*time.Millisecond) || re.Waited != 5*time.Second {
		t.Fatalf("timeout while queued: %+v", re)
	}
}

func TestRetryAfterWithoutMeasurementIsShort(t *testing.T) {
	for _, max := range []time.Duration{0, time.Second, 90 * time.Second} {
		f := newFixture(t, oneGPU(10, admission.Config{MaxRetryAfter: max,
			Classes: []admission.ClassConfig{{Name: "standard", ClassLimits: admission.ClassLimits{MaxQueued: -1}}}}))
		hold := f.acquire(std(10))
		top := 2 * time.Second
		if max == time.Second {
			top = time.Second + 1
		}
		for range 5 {
			if re := f.reject(std(1), admission.ErrQueueFull); re.RetryAfter < time.Second || re.RetryAfter >= top {
				t.Errorf("max %v: RetryAfter %v, want in [1s, %v)", max, re.RetryAfter, top)
			}
		}
		hold.Release()
	}
}
