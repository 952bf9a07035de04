package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
)

func TestAcquireReleaseAndFree(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{}))
	a := f.acquire(std(60))
	b := f.acquire(std(40))
	if free := f.b.Free(); free != 0 {
		t.Fatalf("Free = %d, want 0", free)
	}
	a.Release()
	if free := f.b.Free(); free != 60 || a.Weight() != 0 {
		t.Fatalf("after Release: Free %d, ticket weight %d", free, a.Weight())
	}
	b.Release()
	f.state(0, 0)
	s := f.b.Stats()
	if s.Admitted != 2 || s.AdmittedAfterWait != 0 {
		t.Fatalf("counters: %+v", s)
	}
}

func TestInvalidRequests(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{}))
	for _, r := range []admission.Request{{Weight: 0}, {Weight: -1}, {Weight: 1, Class: "gold"}} {
		tk, err := f.b.Acquire(context.Background(), r)
		if err == nil || tk != nil {
			t.Fatalf("Acquire(%+v) = %v, nil; want an error", r, tk)
		}
		var re *admission.RejectError
		if errors.As(err, &re) || admission.ReasonOf(err) != "" {
			t.Fatalf("Acquire(%+v): %v is a refusal, want a plain error", r, err)
		}
	}
	_, err := f.b.Acquire(context.Background(), admission.Request{Weight: 1, Class: "gold"})
	if want := `admission: class "gold": unknown (have critical, standard, sheddable)`; err.Error() != want {
		t.Fatalf("unknown class error %q, want %q", err, want)
	}
}

// Pins the double free that a non-idempotent Release would be: the second
// call must not give the weight back again (which would let the second
// waiter in beyond capacity).
func TestDoubleReleaseIsNoOp(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{}))
	a := f.acquire(std(10))
	w1 := f.enqueue(context.Background(), std(10))
	w2 := f.enqueue(context.Background(), std(10))
	a.Release()
	b := f.admitted(w1)
	a.Release()
	a.Done(0, 1, false)
	f.state(10, 1)
	f.stillQueued(w2)
	b.Release()
	f.admitted(w2).Release()
	f.state(0, 0)
	var nilTicket *admission.Ticket
	nilTicket.Release() // a nil ticket holds nothing
}

func TestReleaseFromManyGoroutinesOnce(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{}))
	tk := f.acquire(std(7))
	done := make(chan struct{})
	for range 8 {
		go func() { tk.Release(); done <- struct{}{} }()
	}
	for range 8 {
		<-done
	}
	f.state(0, 0)
}

func TestTooLargeNeverBlocksTheQueue(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{}))
	hold := f.acquire(std(100))
	small := f.enqueue(context.Background(), std(10))
	re := f.reject(std(101), admission.ErrTooLarge)
	if re.RetryAfter != 0 || re.Capacity != 100 || re.Weight != 101 || re.Class != "standard" {
		t.Fatalf("too large: %+v", re)
	}
	// Even with free capacity the too-large request is refused, not queued.
	hold.Release()
	f.admitted(small).Release()
	f.reject(std(1000), admission.ErrTooLarge)
	f.state(0, 0)
	if n := f.b.Stats().Rejected[admission.ReasonTooLarge]; n != 2 {
		t.Fatalf("too_large counted %d times, want 2", n)
	}
}

func TestTenantCapRefusesWhatCanNeverFit(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{DefaultTenantShare: 0.5,
		Tenants: []admission.TenantConfig{{Name: "big", Share: 1}}}))
	re := f.reject(req("", "anyone", 51), admission.ErrTenantQuota)
	if re.Capacity != 50 || re.RetryAfter != 0 || re.Tenant != "anyone" {
		t.Fatalf("tenant quota: %+v", re)
	}
	f.reject(req("", "", 51), admission.ErrTenantQuota) // the anonymous tenant has the default share
	f.acquire(req("", "big", 100)).Release()
	f.acquire(req("", "anyone", 50)).Release()
	for _, ts := range f.b.Stats().Tenants {
		if ts.Name == "anyone" {
			t.Fatalf("idle unlisted tenant still tracked: %+v", ts)
		}
	}
}

func TestFIFOWithinClass(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{}))
	hold := f.acquire(chunks(5, 2))
	a := f.enqueue(context.Background(), std(4))
	b := f.enqueue(context.Background(), std(4))
	c := f.enqueue(context.Background(), std(4))
	done(hold, 2) // frees 4: a only
	ta := f.admitted(a)
	f.state(10, 2)
	f.stillQueued(b, c)
	done(hold, 2) // frees 4 more: b only
	tb := f.admitted(b)
	f.state(10, 1)
	hold.Release() // frees 2: c needs 4
	f.state(8, 1)
	ta.Release()
	tc := f.admitted(c)
	if ta.Waited() != 0 {
		t.Fatalf("ticket a waited %v on a clock that did not move", ta.Waited())
	}
	tb.Release()
	tc.Release()
	f.state(0, 0)
	if s := f.b.Stats(); s.AdmittedAfterWait != 3 || s.Admitted != 4 {
		t.Fatalf("counters %+v", s)
	}
}

// A request that continues one the guard stopped waits at that one's place
// in the queue, ahead of those that arrived after it: the stopped one's
// blocks are still held (the backend has yet to let them go) when its
// continuation queues, and the room they leave goes to the continuation.
func TestResumedRequestKeepsItsPlace(t *testing.T) {
	for _, resume := range []bool{false, true} {
		f := newFixture(t, oneGPU(10, admission.Config{Backfill: strictOrder}))
		hold := f.acquire(std(6))
		stopped := f.acquire(std(4))
		later := f.enqueue(context.Background(), std(4))
		cont := std(4)
		if resume {
			cont.Resumes = stopped
		}
		c := f.enqueue(context.Background(), cont)
		stopped.Release() // the backend let its blocks go
		first, second := later, c
		if resume {
			first, second = c, later
		}
		tf := f.admitted(first)
		f.stillQueued(second)
		tf.Release()
		f.admitted(second).Release()
		hold.Release()
		f.state(0, 0)
	}
}

// As in x/sync's semaphore: a waiter that does not fit blocks the smaller
// ones behind it, and new arrivals too, so that it is not starved.
func TestHeadOfLineBlocksSmallerWaitersAndArrivals(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{Backfill: strictOrder}))
	hold := f.acquire(std(5))
	big := f.enqueue(context.Background(), std(8))
	small := f.enqueue(context.Background(), std(2))
	arrival := f.enqueue(context.Background(), std(1)) // would fit, but must not overtake
	f.state(5, 3)
	hold.Release()
	tBig := f.admitted(big)
	tSmall := f.admitted(small)
	f.state(10, 1) // 8+2; the 1 still waits
	tSmall.Release()
	f.admitted(arrival).Release()
	tBig.Release()
	f.state(0, 0)
}

func TestLargeWaiterIsNotStarvedBySmallOnes(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{Backfill: strictOrder}))
	var held []*admission.Ticket
	for range 10 {
		held = append(held, f.acquire(std(1)))
	}
	big := f.enqueue(context.Background(), std(10))
	// A stream of small requests: each queues behind the big one; as the
	// small tickets are released the big one gets in first.
	var smalls []<-chan result
	for range 5 {
		smalls = append(smalls, f.enqueue(context.Background(), std(1)))
	}
	for _, tk := range held {
		tk.Release()
	}
	f.admitted(big).Release()
	for _, ch := range smalls {
		f.admitted(ch).Release()
	}
	f.state(0, 0)
}

func TestClassPriority(t *testing.T) {
	// Threshold 1 so that the sheddable class may queue at full utilization.
	f := newFixture(t, oneGPU(10, admission.Config{PressureThreshold: 1}))
	hold := f.acquire(chunks(2, 5))
	shed := f.enqueue(context.Background(), req("sheddable", "", 5))
	stdW := f.enqueue(context.Background(), req("standard", "", 5))
	crit := f.enqueue(context.Background(), req("critical", "", 5))
	done(hold, 1) // room for one: the critical one, though it came last
	tc := f.admitted(crit)
	f.state(10, 2)
	hold.Release()
	ts := f.admitted(stdW)
	f.state(10, 1)
	tc.Release()
	f.admitted(shed).Release()
	ts.Release()
	f.state(0, 0)
}

// A blocker in a lower class does not hold back a higher class (strict
// priority); a blocker in a higher class holds back everything below it.
func TestBlockerOnlyHoldsBackItsClassAndLower(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{Backfill: strictOrder}))
	hold := f.acquire(std(5))
	blocker := f.enqueue(context.Background(), req("standard", "", 8))
	crit := f.acquire(req("critical", "", 3)) // overtakes the standard blocker
	shed := f.enqueue(context.Background(), req("sheddable", "", 1))
	f.state(8, 2)
	crit.Release()
	hold.Release()
	tb := f.admitted(blocker)
	f.admitted(shed).Release()
	tb.Release()
	f.state(0, 0)
}

func TestDefaultClass(t *testing.T) {
	for _, tc := range []struct {
		name    string
		classes []admission.ClassConfig
		def     string
		want    string
	}{
		{"defaults", nil, "", "standard"},
		{"standard present", []admission.ClassConfig{{Name: "a"}, {Name: "b"}, {Name: "standard"}}, "", "standard"},
		{"middle of three", []admission.ClassConfig{{Name: "a"}, {Name: "b"}, {Name: "c"}}, "", "b"},
		{"lower of two", []admission.ClassConfig{{Name: "a"}, {Name: "b"}}, "", "b"},
		{"only one", []admission.ClassConfig{{Name: "a"}}, "", "a"},
		{"explicit", []admission.ClassConfig{{Name: "a"}, {Name: "b"}}, "a", "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, oneGPU(10, admission.Config{Classes: tc.classes, DefaultClass: tc.def}))
			hold := f.acquire(std(10))
			re := f.reject(std(11), admission.ErrTooLarge)
			if re.Class != tc.want {
				t.Fatalf("default class %q, want %q", re.Class, tc.want)
			}
			hold.Release()
		})
	}
}

func TestCanceledBeforeAcquire(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tk, err := f.b.Acquire(ctx, std(1))
	if tk != nil || !errors.Is(err, context.Canceled) || admission.ReasonOf(err) != admission.ReasonCanceled {
		t.Fatalf("Acquire with a done ctx = %v, %v", tk, err)
	}
	f.state(0, 0)
	if s := f.b.Stats(); s.Canceled != 1 || s.Admitted != 0 {
		t.Fatalf("counters %+v", s)
	}
}

func TestCancelWhileQueued(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{}))
	hold := f.acquire(std(10))
	ctx, cancel := context.WithCancel(context.Background())
	ch := f.enqueue(ctx, std(5))
	f.clock.Advance(3 * time.Second)
	cancel()
	res := <-ch
	if res.tk != nil || !errors.Is(res.err, context.Canceled) || admission.ReasonOf(res.err) != admission.ReasonCanceled {
		t.Fatalf("canceled waiter = %v, %v", res.tk, res.err)
	}
	f.state(10, 0)
	hold.Release()
	f.state(0, 0)
	ev := f.rec.Events()
	last := ev[len(ev)-1]
	if last.Reason != admission.ReasonCanceled || last.Waited != 3*time.Second || last.Weight != 5 {
		t.Fatalf("observer saw %v", last)
	}
	if f.clock.Pending() != 0 {
		t.Fatalf("the canceled waiter's deadline timer is still pending")
	}
}

func TestCanceledHeadOfLineWakesThoseBehind(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{Backfill: strictOrder}))
	hold := f.acquire(std(5))
	ctx, cancel := context.WithCancel(context.Background())
	big := f.enqueue(ctx, std(8))
	small1 := f.enqueue(context.Background(), std(2))
	small2 := f.enqueue(context.Background(), std(3))
	cancel()
	if res := <-big; !errors.Is(res.err, context.Canceled) {
		t.Fatalf("big: %v", res.err)
	}
	f.admitted(small1).Release()
	f.admitted(small2).Release()
	hold.Release()
	f.state(0, 0)
}

// expiring is a context whose deadline passes when the test says so (a real
// 1 ms deadline could pass before the request even queued, on a busy
// machine).
type expiring struct {
	context.Context
	done chan struct{}
}

func (c expiring) Done() <-chan struct{} { return c.done }

func (c expiring) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func TestContextDeadlineWhileQueued(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{}))
	hold := f.acquire(std(10))
	ctx := expiring{Context: context.Background(), done: make(chan struct{})}
	ch := f.enqueue(ctx, std(5))
	close(ctx.done)
	res := <-ch
	if !errors.Is(res.err, context.DeadlineExceeded) || admission.ReasonOf(res.err) != admission.ReasonCanceled {
		t.Fatalf("ctx deadline while queued: %v", res.err)
	}
	hold.Release()
	f.state(0, 0)
}

// The grant and the cancellation race; whichever wins, nothing may stay
// held and the caller's view must agree with the budget's.
func TestGrantCancelRaceLeavesNothing(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{}))
	for i := range 300 {
		hold := f.acquire(std(10))
		ctx, cancel := context.WithCancel(context.Background())
		ch := f.enqueue(ctx, std(10))
		go hold.Release()
		if i%2 == 0 {
			cancel()
		} else {
			go cancel()
		}
		res := <-ch
		switch {
		case res.err == nil:
			res.tk.Release()
		case !errors.Is(res.err, context.Canceled):
			t.Fatalf("iteration %d: %v", i, res.err)
		}
		for f.b.Stats().Held != 0 { // the release runs in its own goroutine
		}
		f.state(0, 0)
	}
	s := f.b.Stats()
	if s.Admitted+s.Canceled != 600 {
		t.Fatalf("every exit counted once: admitted %d + canceled %d != 600", s.Admitted, s.Canceled)
	}
}

func TestDoneGivesBackFinishedSequences(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{}))
	tk := f.acquire(chunks(5, 2))
	w := f.enqueue(context.Background(), std(3))
	tk.Done(5, 1, false) // no such group: nothing
	tk.Done(0, -1, false)
	f.state(10, 1)
	done(tk, 2)
	if tk.Weight() != 6 {
		t.Fatalf("weight after two of five sequences finished = %d", tk.Weight())
	}
	tw := f.admitted(w)
	f.state(9, 0)
	done(tk, 3) // the last one gives back everything, as Release would
	if tk.Weight() != 0 {
		t.Fatalf("weight after every sequence finished = %d", tk.Weight())
	}
	tk.Release()
	done(tk, 1)
	f.state(3, 0)
	tw.Release()
	f.state(0, 0)
}

func TestReasonOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("x"), ""},
		{&admission.RejectError{Reason: admission.ErrTooLarge}, "too_large"},
		{&admission.RejectError{Reason: admission.ErrQueueFull}, "queue_full"},
		{&admission.RejectError{Reason: admission.ErrQueueTimeout}, "queue_timeout"},
		{&admission.RejectError{Reason: admission.ErrOverloaded}, "overloaded"},
		{&admission.RejectError{Reason: admission.ErrTenantQuota}, "tenant_quota"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "canceled"},
	} {
		if got := admission.ReasonOf(tc.err); got != tc.want {
			t.Errorf("ReasonOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
	// Each refusal matches exactly one sentinel.
	sentinels := []error{admission.ErrTooLarge, admission.ErrQueueFull, admission.ErrQueueTimeout, admission.ErrOverloaded, admission.ErrTenantQuota}
	for _, s := range sentinels {
		err := error(&admission.RejectError{Reason: s})
		n := 0
		for _, o := range sentinels {
			if errors.Is(err, o) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%v matches %d sentinels", s, n)
		}
	}
}

func TestAcquireTicketIntoCallerStorage(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{}))
	var mine struct {
		id int
		tk admission.Ticket
	}
	if err := f.b.AcquireTicket(context.Background(), std(6), &mine.tk); err != nil {
		t.Fatal(err)
	}
	if mine.tk.Weight() != 6 {
		t.Fatalf("weight %d", mine.tk.Weight())
	}
	if err := f.b.AcquireTicket(context.Background(), std(1), &mine.tk); err == nil {
		t.Fatal("a ticket that holds weight was reused")
	}
	// Queued into the caller's ticket.
	var other admission.Ticket
	done := make(chan error, 1)
	go func() { done <- f.b.AcquireTicket(context.Background(), std(8), &other) }()
	admissiontest.WaitQueued(f.b.Scheduler, 1)
	f.clock.Advance(time.Second)
	mine.tk.Release()
	if err := <-done; err != nil || other.Weight() != 8 || other.Waited() != time.Second {
		t.Fatalf("queued AcquireTicket: %v, weight %d, waited %v", err, other.Weight(), other.Waited())
	}
	// A released ticket can be used again; a refusal leaves it empty.
	other.Release()
	if err := f.b.AcquireTicket(context.Background(), std(11), &other); !errors.Is(err, admission.ErrTooLarge) || other.Weight() != 0 {
		t.Fatalf("refused AcquireTicket: %v, weight %d", err, other.Weight())
	}
	if err := f.b.AcquireTicket(context.Background(), std(10), &mine.tk); err != nil || mine.tk.Waited() != 0 {
		t.Fatalf("reuse: %v, waited %v", err, mine.tk.Waited())
	}
	mine.tk.Release()
	mine.tk.Release()
	f.state(0, 0)
	if err := f.b.AcquireTicket(context.Background(), std(1), nil); err == nil {
		t.Fatal("nil ticket accepted")
	}
}
