package gateway

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The requests in flight, and the sweep that acts on them with time.
//
// A request is put in the set when it arrives and taken out by its finish.
// One goroutine sweeps the set every sweepTick while anything is in flight,
// and parks when nothing has been for parkAfter ticks. It is the only clock
// the proxy path has: no request arms a timer of its own.
//
//   - Client watch. Asking the kernel to report a client's hang-up costs
//     two epoll_ctl calls, a sizeable share of a short request's cost, and
//     only a request that waits needs it. A request still in admission
//     queueWatchTicks after it got there is waiting in the queue; any request
//     still in flight answerWatchTicks after it arrived is waiting for its
//     answer (or streaming one). The sweep registers the watch of those
//     (connwatch); the rest finish unwatched. A hang-up is thus noticed at
//     most two ticks (4 ms) after a request starts to queue, and at most
//     answerWatchTicks + 1 (22 ms) after it arrived otherwise. A tick of
//     2 ms costs the sweep about 0.5% of a core under load.
//   - Deadlines. Every deadlineEvery ticks the sweep ends the requests past
//     server.request_timeout (errRequestTimeout) and the streamed ones whose
//     backend's first event is past first_byte_timeout
//     (errFirstByteTimeout), at most 20 ms late. Both are limits of
//     seconds; the scan of every request in flight is kept off most ticks.
//   - Shutdown ends every request in the set (errShutdown), and any that
//     arrives after.
//
// The set is sharded (a request picks a shard in turn) so that arrivals and
// finishes on both cores rarely meet on one mutex. In a shard, young holds
// the requests younger than answerWatchTicks in order of arrival (so aging
// takes them from its head), old the rest. Lock order: a shard's mutex,
// then nothing; watches are registered and contexts ended after it is
// released.
type inflight struct {
	shards [flightShards]flightShard
	next   atomic.Uint32
	// tick counts sweeps; a request notes it on arrival and on entering
	// admission.
	tick atomic.Uint64
}

const (
	flightShards     = 16
	sweepTick        = 2 * time.Millisecond
	queueWatchTicks  = 1
	answerWatchTicks = 10
	deadlineEvery    = 10
	parkAfter        = 50
)

type flightShard struct {
	mu         sync.Mutex // guards young, old and the list fields of their requests
	young, old flightList
	_          [64]byte // its own cache line
}

type flightList struct{ head, tail *exchange }

// flight is an exchange's membership of the set.
type flight struct {
	prev, next *exchange    // in its list; guarded by shard.mu
	shard      *flightShard // nil once out of the set
	old        bool         // in shard.old; guarded by shard.mu
	arrived    uint64       // tick of arrival
	// watchDue is the tick from which the sweep watches the client even if
	// the request is still young (it is in admission); MaxUint64 = by age
	// alone.
	watchDue atomic.Uint64
	// watchTaken: the sweep has taken the watch on; only the sweep reads
	// and writes it.
	watchTaken bool
	// firstByte is the first-byte deadline of a streamed request in Unix
	// nanoseconds while it runs, 0 when there is none (or it was stopped),
	// firstByteFired once the sweep ended the request for it.
	firstByte atomic.Int64
}

const firstByteFired = -1

func (l *flightList) push(x *exchange) {
	x.fl.prev, x.fl.next = l.tail, nil
	if l.tail != nil {
		l.tail.fl.next = x
	} else {
		l.head = x
	}
	l.tail = x
}

func (l *flightList) remove(x *exchange) {
	if x.fl.prev != nil {
		x.fl.prev.fl.next = x.fl.next
	} else {
		l.head = x.fl.next
	}
	if x.fl.next != nil {
		x.fl.next.fl.prev = x.fl.prev
	} else {
		l.tail = x.fl.prev
	}
	x.fl.prev, x.fl.next = nil, nil
}

// add puts x in the set.
func (f *inflight) add(x *exchange) {
	sh := &f.shards[f.next.Add(1)%flightShards]
	x.fl.arrived = f.tick.Load()
	x.fl.watchDue.Store(math.MaxUint64)
	sh.mu.Lock()
	x.fl.shard = sh
	sh.young.push(x)
	sh.mu.Unlock()
}

// remove takes x out of the set; the sweep will not pick it again (one it
// has picked already may still act on it: every such act is harmless on a
// finished request).
func (f *inflight) remove(x *exchange) {
	sh := x.fl.shard
	if sh == nil {
		return
	}
	sh.mu.Lock()
	if x.fl.old {
		sh.old.remove(x)
	} else {
		sh.young.remove(x)
	}
	x.fl.shard = nil
	sh.mu.Unlock()
}

// admitting says x enters admission now: if it is still there
// queueWatchTicks from now, it is queued, and its client is watched.
func (f *inflight) admitting(x *exchange) {
	x.fl.watchDue.Store(f.tick.Load() + queueWatchTicks)
}

// admitted says x left admission: from now on only its age decides.
func (f *inflight) admitted(x *exchange) { x.fl.watchDue.Store(math.MaxUint64) }

// sweepWork is what one sweep found to do, acted on outside the shards'
// locks. Its slices are reused from sweep to sweep.
type sweepWork struct {
	watch, timedOut, firstByte []*exchange
}

func (w *sweepWork) reset() {
	clear(w.watch)
	clear(w.timedOut)
	clear(w.firstByte)
	w.watch, w.timedOut, w.firstByte = w.watch[:0], w.timedOut[:0], w.firstByte[:0]
}

// sweep finds, at tick, the requests whose client must be watched from now
// on and, when deadlines is set, those past a deadline at now.
func (f *inflight) sweep(tick uint64, now time.Time, deadlines bool, w *sweepWork) {
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for x := sh.young.head; x != nil && tick-x.fl.arrived >= answerWatchTicks; x = sh.young.head {
			sh.young.remove(x)
			sh.old.push(x)
			x.fl.old = true
			if !x.fl.watchTaken {
				x.fl.watchTaken = true
				w.watch = append(w.watch, x)
			}
		}
		for x := sh.young.head; x != nil; x = x.fl.next {
			if !x.fl.watchTaken && x.fl.watchDue.Load() <= tick {
				x.fl.watchTaken = true
				w.watch = append(w.watch, x)
			}
		}
		if deadlines {
			ns := now.UnixNano()
			for _, l := range [2]*flightList{&sh.young, &sh.old} {
				for x := l.head; x != nil; x = x.fl.next {
					if !now.Before(x.rctx.deadline) {
						w.timedOut = append(w.timedOut, x)
					} else if fb := x.fl.firstByte.Load(); fb > 0 && ns >= fb {
						w.firstByte = append(w.firstByte, x)
					}
				}
			}
		}
		sh.mu.Unlock()
	}
}

// each calls fn for every request in the set, outside the shards' locks.
func (f *inflight) each(fn func(*exchange)) {
	var all []*exchange
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for _, l := range [2]*flightList{&sh.young, &sh.old} {
			for x := l.head; x != nil; x = x.fl.next {
				all = append(all, x)
			}
		}
		sh.mu.Unlock()
	}
	for _, x := range all {
		fn(x)
	}
}

// sweepLoop runs the sweep until stop closes.
func (s *Server) sweepLoop(stop <-chan struct{}) {
	defer close(s.sweepDone)
	t := time.NewTicker(sweepTick)
	defer t.Stop()
	var w sweepWork
	idle := 0
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		tick := s.flights.tick.Add(1)
		if s.active.Load() > 0 {
			idle = 0
			var now time.Time
			deadlines := tick%deadlineEvery == 0
			if deadlines {
				now = s.now()
			}
			s.flights.sweep(tick, now, deadlines, &w)
			s.act(&w)
			continue
		}
		if idle++; idle < parkAfter {
			continue
		}
		// Nothing in flight for a while: sleep until a request comes (it
		// wakes the loop when it sees parked; parked is set before active
		// is read again, so one of the two sees the other).
		t.Stop()
		s.parked.Store(true)
		if s.active.Load() == 0 {
			select {
			case <-s.wake:
			case <-stop:
				return
			}
		}
		s.parked.Store(false)
		t.Reset(sweepTick)
		idle = 0
	}
}

// act does what a sweep found.
func (s *Server) act(w *sweepWork) {
	for _, x := range w.watch {
		x.watchClient()
	}
	for _, x := range w.timedOut {
		x.rctx.cancel(errRequestTimeout)
	}
	var ns int64
	if len(w.firstByte) > 0 {
		ns = s.now().UnixNano()
	}
	for _, x := range w.firstByte {
		if fb := x.fl.firstByte.Load(); fb > 0 && ns >= fb && x.fl.firstByte.CompareAndSwap(fb, firstByteFired) {
			x.rctx.cancel(errFirstByteTimeout)
		}
	}
	w.reset()
}

// wakeSweep wakes a parked sweep: a request has arrived.
func (s *Server) wakeSweep() {
	if s.parked.Load() {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}
