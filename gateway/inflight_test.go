package gateway

import (
	"context"
	"errors"
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
	}
	add := func(names ...string) func(*inflight, map[string]*exchange) {
		return func(f *inflight, x map[string]*exchange) {
			for _, n := range names {
				x[n] = &exchange{label: n}
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
			{tick: answerWatchTicks - 1},
			{tick: answerWatchTicks - 1, do: func(f *inflight, x map[string]*exchange) { f.remove(x["a"]) }},
			{tick: answerWatchTicks},
			{tick: 10 * answerWatchTicks},
		}},
		{"one still in flight at answerWatchTicks is watched, once", []step{
			{tick: 0, do: add("a", "b")},
			{tick: 5, do: add("c")},
			{tick: answerWatchTicks, watch: []string{"a", "b"}},
			{tick: answerWatchTicks + 4},
			{tick: answerWatchTicks + 5, watch: []string{"c"}},
			{tick: 10 * answerWatchTicks},
		}},
		{"one that stays in admission queueWatchTicks is watched then", []step{
			{tick: 0, do: add("a", "b")},
			{tick: 3, do: func(f *inflight, x map[string]*exchange) { f.tick.Store(3); f.admitting(x["a"]); f.admitting(x["b"]) }},
			{tick: 3 + queueWatchTicks - 1},
			{tick: 3 + queueWatchTicks - 1, do: func(f *inflight, x map[string]*exchange) { f.admitted(x["b"]) }}, // admitted at once
			{tick: 3 + queueWatchTicks, watch: []string{"a"}},
			{tick: answerWatchTicks, watch: []string{"b"}}, // still waiting for its answer
			{tick: 10 * answerWatchTicks},
		}},
		{"an old request removed leaves the old list intact", []step{
			{tick: 0, do: add("a", "b", "c")},
			{tick: answerWatchTicks, watch: []string{"a", "b", "c"}},
			{tick: answerWatchTicks, do: func(f *inflight, x map[string]*exchange) { f.remove(x["b"]); f.remove(x["a"]); f.remove(x["c"]) }},
			{tick: answerWatchTicks, do: add("d")},
			{tick: 2 * answerWatchTicks, watch: []string{"d"}},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var f inflight
			x := map[string]*exchange{}
			var w sweepWork
			for i, st := range c.steps {
				f.tick.Store(st.tick)
				if st.do != nil {
					st.do(&f, x)
					continue
				}
				f.sweep(st.tick, time.Time{}, false, &w)
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
	if short.ctx = &short.rctx; !errors.Is(short.ctx.Err(), context.DeadlineExceeded) {
		t.Errorf("a timed-out request's Err() = %v, want DeadlineExceeded", short.ctx.Err())
	}
}
