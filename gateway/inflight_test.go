package gateway

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"
)

// The sweep stepped by hand: which requests have their client watched, at
// which tick. Steps run in order on one set; each names the requests the
// sweep at that tick must pick for a watch.
func TestSweepWatchesWaitingRequests(t *testing.T) {
	type step struct {
		tick  uint64
		do    func(f *inflight, x map[string]*exchange)
		watch []string
		next  uint64 // the tick the sweep says it is next due
	}
	const none = math.MaxUint64
	add := func(names ...string) func(*inflight, map[string]*exchange) {
		return func(f *inflight, x map[string]*exchange) {
			for _, n := range names {
				// Arrived in the middle of the step's tick.
				start := f.epoch.Add(time.Duration(f.tick.Load())*sweepTick + sweepTick/2)
				x[n] = &exchange{label: n, start: start}
				f.add(x[n])
			}
		}
	}
	for _, c := range []struct {
		name  string
		steps []step
	}{
		{"a request that finishes young is never watched", []step{
			{tick: 0, do: add("a")},
			{tick: answerWatchTicks - 1, next: answerWatchTicks},
			{tick: answerWatchTicks - 1, do: func(f *inflight, x map[string]*exchange) { f.remove(x["a"]) }},
			{tick: answerWatchTicks, next: none},
			{tick: 10 * answerWatchTicks, next: none},
		}},
		{"one still in flight at answerWatchTicks is watched, once", []step{
			{tick: 0, do: add("a", "b")},
			{tick: 5, do: add("c")},
			{tick: answerWatchTicks, watch: []string{"a", "b"}, next: 5 + answerWatchTicks},
			{tick: answerWatchTicks + 4, next: 5 + answerWatchTicks},
			{tick: answerWatchTicks + 5, watch: []string{"c"}, next: none},
			{tick: 10 * answerWatchTicks, next: none},
		}},
		{"one that stays in admission queueWatchTicks is watched then", []step{
			{tick: 0, do: add("a", "b")},
			{tick: 3, do: func(f *inflight, x map[string]*exchange) { f.admitting(x["a"]); f.admitting(x["b"]) }},
			{tick: 3 + queueWatchTicks - 1, next: 3 + queueWatchTicks},
			{tick: 3 + queueWatchTicks - 1, do: func(f *inflight, x map[string]*exchange) { f.admitted(x["b"]) }}, // admitted at once
			{tick: 3 + queueWatchTicks, watch: []string{"a"}, next: answerWatchTicks},
			{tick: answerWatchTicks, watch: []string{"b"}, next: none}, // still waiting for its answer
			{tick: 10 * answerWatchTicks, next: none},
		}},
		{"a request entering admission while the sweep slept is due a tick after it arrived", []step{
			{tick: 0, do: add("a")},
			{tick: 6, do: add("b")},
			{tick: 2, do: func(f *inflight, x map[string]*exchange) { f.admitting(x["b"]) }}, // the sweep's tick is behind
			{tick: 6 + queueWatchTicks, watch: []string{"b"}, next: answerWatchTicks},
		}},
		{"an old request removed leaves the old list intact", []step{
			{tick: 0, do: add("a", "b", "c")},
			{tick: answerWatchTicks, watch: []string{"a", "b", "c"}, next: none},
			{tick: answerWatchTicks, do: func(f *inflight, x map[string]*exchange) { f.remove(x["b"]); f.remove(x["a"]); f.remove(x["c"]) }},
			{tick: answerWatchTicks, do: add("d")},
			{tick: 2 * answerWatchTicks, watch: []string{"d"}, next: none},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := inflight{epoch: time.Unix(1_800_000_000, 0)}
			x := map[string]*exchange{}
			var w sweepWork
			for i, st := range c.steps {
				f.tick.Store(st.tick)
				if st.do != nil {
					st.do(&f, x)
					continue
				}
				next := f.sweep(st.tick, time.Time{}, false, &w)
				if next != st.next {
					t.Errorf("step %d (tick %d): next due at %d, want %d", i, st.tick, next, st.next)
				}
				var got []string
				for _, e := range w.watch {
					got = append(got, e.label)
				}
				slices.Sort(got)
				if !slices.Equal(got, st.watch) {
					t.Errorf("step %d (tick %d): watched %v, want %v", i, st.tick, got, st.watch)
				}
				w.reset()
			}
			if n := flightCount(&f); n != len(x)-removed(x) {
				t.Errorf("%d in the set, want %d", n, len(x)-removed(x))
			}
		})
	}
}

func flightCount(f *inflight) int {
	n := 0
	for i := range f.shards {
		for _, l := range [2]*flightList{&f.shards[i].young, &f.shards[i].old} {
			for x := l.head; x != nil; x = x.fl.next {
				n++
			}
		}
	}
	return n
}

func removed(x map[string]*exchange) int {
	n := 0
	for _, e := range x {
		if e.fl.shard == nil {
			n++
		}
	}
	return n
}

// Deadlines, stepped by hand: the sweep ends a request past
// server.request_timeout with errRequestTimeout and a streamed one whose
// first event is late with errFirstByteTimeout, unless the first event came
// (answered), and touches nothing else.
func TestSweepEndsRequestsPastTheirDeadlines(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	now := t0
	s := &Server{now: func() time.Time { return now }}
	mk := func(timeout, firstByte time.Duration) *exchange {
		x := &exchange{s: s}
		x.rctx.deadline = t0.Add(timeout)
		if firstByte > 0 {
			x.fl.firstByte.Store(t0.Add(firstByte).UnixNano())
		}
		s.flights.add(x)
		return x
	}
	long := mk(time.Minute, 0)
	short := mk(time.Second, 0)
	stream := mk(time.Minute, 300*time.Millisecond)
	answered := mk(time.Minute, 300*time.Millisecond)
	finished := mk(time.Second, 0)
	s.flights.remove(finished)
	var w sweepWork
	answer := func() {
		if !answered.stopFirstByte() {
			t.Fatal("stopFirstByte: the clock of a request answered in time ran out")
		}
	}
	for _, st := range []struct {
		at     time.Duration
		before func()
		want   map[*exchange]error
	}{
		{0, nil, map[*exchange]error{}},
		{299 * time.Millisecond, answer, map[*exchange]error{}},
		{300 * time.Millisecond, nil, map[*exchange]error{stream: errFirstByteTimeout}},
		{999 * time.Millisecond, nil, map[*exchange]error{stream: errFirstByteTimeout}},
		{time.Second, nil, map[*exchange]error{stream: errFirstByteTimeout, short: errRequestTimeout}},
	} {
		if st.before != nil {
			st.before()
		}
		now = t0.Add(st.at)
		s.flights.sweep(1, now, true, &w)
		s.act(&w)
		for _, x := range []*exchange{long, short, stream, answered, finished} {
			if got := x.rctx.Cause(); got != st.want[x] {
				t.Errorf("at %s: cause %v, want %v", st.at, got, st.want[x])
			}
		}
	}
	if stream.stopFirstByte() {
		t.Error("stopFirstByte after the sweep fired it reported the clock stopped in time")
	}
	if !errors.Is(short.rctx.Err(), context.DeadlineExceeded) {
		t.Errorf("a timed-out request's Err() = %v, want DeadlineExceeded", short.rctx.Err())
	}
}

// The sweep's clock stepped by hand: it sleeps until the first thing that
// can be due (a young request turning answerWatchTicks old, one in
// admission reaching its watchDue, the next deadline scan), never longer
// than answerWatchTicks, and parks after parkAfter ticks with nothing in
// flight.
func TestSweepSleepsUntilSomethingIsDue(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(tick uint64) time.Time { return t0.Add(time.Duration(tick) * sweepTick) }
	s := &Server{}
	s.flights.epoch = t0
	var st sweepState
	var w sweepWork
	x := &exchange{s: s, start: at(60).Add(sweepTick / 2)}
	x.rctx.deadline = at(75)
	for i, c := range []struct {
		at     time.Time
		before func()
		wake   uint64 // the tick it sleeps until; 0 with park
		park   bool
	}{
		{at: at(0), wake: answerWatchTicks}, // idle: a request may come
		{at: at(10), wake: 20},
		{at: at(49).Add(sweepTick / 3), wake: 59},
		{at: at(50), park: true},
		// Unparked by a request arriving in tick 60: due by age at 70.
		{at: at(61), before: func() { st = sweepState{}; s.flights.add(x); s.active.Add(1) }, wake: 70},
		// It enters admission and waits at once (which wakes the sweep):
		// due a tick later.
		{at: at(61).Add(sweepTick / 2), before: func() { s.flights.admitting(x) }, wake: 62},
		{at: at(62), wake: 70},
		{at: at(70), wake: 71}, // old now: only the deadline scan is due
		{at: at(71), wake: 81}, // its deadline (75) not reached
		{at: at(81), wake: 91}, // the scan ends it
		{at: at(90), before: func() { s.flights.remove(x); s.active.Add(-1) }, wake: 100}, // finished
		{at: at(139), wake: 149},
		{at: at(140), park: true},
	} {
		if c.before != nil {
			c.before()
		}
		sleep, park := s.sweepStep(c.at, &st, &w)
		if park != c.park {
			t.Fatalf("step %d (%s): park %v, want %v", i, c.at.Sub(t0), park, c.park)
		}
		if park {
			continue
		}
		if sleep <= 0 {
			t.Fatalf("step %d (%s): sleeps %s", i, c.at.Sub(t0), sleep)
		}
		if wake := s.flights.tickAt(c.at.Add(sleep)); wake != c.wake || !c.at.Add(sleep).Equal(at(wake)) {
			t.Errorf("step %d (%s): wakes at %s (tick %d), want tick %d", i, c.at.Sub(t0), c.at.Add(sleep).Sub(t0), wake, c.wake)
		}
		switch i {
		case 5:
			if x.fl.watchTaken {
				t.Errorf("step %d: watched %d ticks after entering admission, want %d", i, 0, queueWatchTicks)
			}
		case 6:
			if !x.fl.watchTaken {
				t.Errorf("step %d: not watched %d tick after entering admission", i, queueWatchTicks)
			}
		case 8:
			if x.rctx.Cause() != nil {
				t.Errorf("step %d: ended (%v) before its deadline", i, x.rctx.Cause())
			}
		case 9:
			if x.rctx.Cause() != errRequestTimeout {
				t.Errorf("step %d: cause %v past its deadline, want errRequestTimeout", i, x.rctx.Cause())
			}
		}
	}
}

// The sweep's loop on a manual clock: it sleeps on one timer of the
// clock's, parks with none while nothing is in flight, is woken by a
// request, and ends it once the clock passes its deadline — however late
// the wall clock says it is.
func TestSweepLoopSleepsOnTheClock(t *testing.T) {
	clock := newClock()
	s := &Server{opt: Options{Clock: clock}, now: clock.Now}
	s.flights.epoch = clock.Now()
	s.flights.wake, s.flights.sweepStop, s.flights.sweepDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go s.sweepLoop(s.flights.sweepStop)
	defer func() {
		close(s.flights.sweepStop)
		<-s.flights.sweepDone
	}()
	eventually(t, "the sweep's first timer", func() bool { return clock.Pending() == 1 })
	advanceUntil(t, clock, answerWatchTicks*sweepTick, "the idle sweep to park", s.flights.parked.Load)
	if n := clock.Pending(); n != 0 {
		t.Fatalf("%d timers on the clock with the sweep parked", n)
	}
	x := &exchange{s: s, start: clock.Now()}
	x.rctx.deadline = x.start.Add(time.Second)
	s.flights.add(x)
	s.active.Add(1)
	s.wakeSweep()
	eventually(t, "the sweep to wake and sleep on the clock again", func() bool { return !s.flights.parked.Load() && clock.Pending() == 1 })
	if x.rctx.Cause() != nil {
		t.Fatalf("ended (%v) before the clock moved", x.rctx.Cause())
	}
	clock.Advance(time.Second)
	// A deadline scan comes every deadlineEvery ticks.
	advanceUntil(t, clock, sweepTick, "the request to end at its deadline", func() bool { return x.rctx.Cause() != nil })
	if x.rctx.Cause() != errRequestTimeout {
		t.Fatalf("cause %v, want errRequestTimeout", x.rctx.Cause())
	}
}
