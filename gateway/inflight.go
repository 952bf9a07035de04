package gateway

import (
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/connwatch"
)

// The requests in flight, and the sweep that acts on them with time.
//
// A request is put in the set when it arrives and taken out by its finish.
// One goroutine sweeps the set, in ticks of sweepTick on the Options' clock
// counted from the server's start. It is the only timer the proxy path
// has: no request arms one of its own.
//
//   - Client watch. Asking the kernel to report a client's hang-up costs
//     two epoll_ctl calls, a sizeable share of a short request's cost, and
//     only a request that waits needs it. A request still in admission
//     queueWatchTicks after it got there is waiting in the queue; any request
//     still in flight answerWatchTicks after it arrived is waiting for its
//     answer (or streaming one). The sweep registers the watch of those
//     (connwatch); the rest finish unwatched. A hang-up is thus noticed at
//     most two ticks (4 ms) after a request starts to queue, and otherwise
//     at most answerWatchTicks + 2 ticks (24 ms) after it arrived (one tick
//     for the tick it arrived in, one for a sweep that read its clock
//     before the request was added and slept).
//   - Deadlines. Every deadlineEvery ticks while anything is in flight the
//     sweep ends the requests past server.request_timeout
//     (errRequestTimeout) and the streamed ones whose backend's first event
//     is past first_byte_timeout (errFirstByteTimeout), at most 20 ms late.
//     Both are limits of seconds; the scan of every request in flight is
//     kept off most sweeps.
//   - Shutdown ends every request in the set (errShutdown), and any that
//     arrives after.
//
// The sweep wakes only when something can be due: the tick at which the
// oldest young request turns answerWatchTicks old or a request in
// admission reaches its watchDue, the next deadline scan, and at once when
// a request begins to wait (it asks for its context's Done channel, which
// only a wait does: reqCtx.waiting). A request arriving while it sleeps is
// due answerWatchTicks later at the earliest, and the sweep never sleeps
// longer than that. Ticking every 2 ms instead woke an idle core 500 times
// a second: at one connection, where each wake-up costs a thread switch,
// that was a sixth to a fifth of a request's CPU. With nothing in flight for
// parkAfter ticks it parks until a request arrives.
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
	// epoch is tick 0 (the server's start); a request's arrival tick is
	// that of its start time.
	epoch time.Time
	// tick is the tick of the last sweep, which a request entering
	// admission reads (it may be behind while the sweep sleeps).
	tick atomic.Uint64

	parked    atomic.Bool   // the sweep sleeps until wake
	wake      chan struct{} // a request arrived while the sweep was parked, or began to wait
	sweepStop chan struct{}
	sweepDone chan struct{}
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
	watch     clientWatch
}

// clientWatch watches a request's client for a hang-up, from when the
// sweep starts it to the request's finish.
type clientWatch struct {
	conn  net.Conn   // the client's
	mu    sync.Mutex // guards stop and ended
	stop  func() bool
	ended bool // finished: the client is never watched again
}

// start watches the client, calling hangUp when it hangs up. It holds mu
// across the registration, which only the request's own finish waits for.
func (w *clientWatch) start(watcher *connwatch.Watcher, hangUp func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended || w.conn == nil {
		return
	}
	if stop, err := watcher.Watch(socketOf(w.conn), hangUp); err == nil {
		w.stop = stop
	}
}

// end stops watching the client, for good.
func (w *clientWatch) end() {
	w.mu.Lock()
	w.ended = true
	stop := w.stop
	w.stop = nil
	w.mu.Unlock()
	if stop != nil {
		stop()
	}
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

// tickAt is the tick t falls in.
func (f *inflight) tickAt(t time.Time) uint64 {
	d := t.Sub(f.epoch)
	if d < 0 {
		return 0
	}
	return uint64(d / sweepTick)
}

// add puts x in the set, as arrived at x.start.
func (f *inflight) add(x *exchange) {
	sh := &f.shards[f.next.Add(1)%flightShards]
	x.fl.arrived = f.tickAt(x.start)
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
// queueWatchTicks from now, it is queued, and its client is watched. Now
// is the last sweep's tick or x's arrival, whichever is later: no clock is
// read, and a tick behind only has a request that waits watched sooner.
func (f *inflight) admitting(x *exchange) {
	x.fl.watchDue.Store(max(f.tick.Load(), x.fl.arrived) + queueWatchTicks)
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
// on and, when deadlines is set, those past a deadline at now. next is the
// first tick after it at which a request now in the set is due a watch
// (math.MaxUint64: none is).
func (f *inflight) sweep(tick uint64, now time.Time, deadlines bool, w *sweepWork) (next uint64) {
	next = math.MaxUint64
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
		if x := sh.young.head; x != nil {
			next = min(next, x.fl.arrived+answerWatchTicks)
		}
		for x := sh.young.head; x != nil; x = x.fl.next {
			if x.fl.watchTaken {
				continue
			}
			if due := x.fl.watchDue.Load(); due <= tick {
				x.fl.watchTaken = true
				w.watch = append(w.watch, x)
			} else {
				next = min(next, due)
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
	return next
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

// sweepLoop runs the sweep until stop closes. It sleeps on the Options'
// clock, one timer at a time: a test holding a manual clock advances it
// and the deadlines it passes fire.
func (s *Server) sweepLoop(stop <-chan struct{}) {
	defer close(s.flights.sweepDone)
	clock := s.opt.Clock
	due := make(chan struct{}, 1)
	fire := func() {
		select {
		case due <- struct{}{}:
		default: // a stopped timer's late fire is pending already: one wake does
		}
	}
	t := clock.AfterFunc(sweepTick, fire)
	defer func() { t.Stop() }()
	var w sweepWork
	var st sweepState
	for {
		select {
		case <-stop:
			return
		case <-due:
		case <-s.flights.wake: // a request began to wait
		}
		t.Stop()
		sleep, park := s.sweepStep(s.now(), &st, &w)
		if park {
			// Nothing in flight for a while: sleep until a request comes
			// (it wakes the loop when it sees parked; parked is set before
			// active is read again, so one of the two sees the other).
			s.flights.parked.Store(true)
			if s.active.Load() == 0 {
				select {
				case <-s.flights.wake:
				case <-stop:
					return
				}
			}
			s.flights.parked.Store(false)
			st = sweepState{}
			sleep = 0
		}
		t = clock.AfterFunc(sleep, fire)
	}
}

// sweepState is what the sweep remembers from one wake to the next.
type sweepState struct {
	deadlinesAt uint64 // tick of the next deadline scan
	idle        bool   // nothing was in flight at the last wake
	idleSince   uint64 // tick from which nothing has been in flight
}

// sweepStep sweeps at now and says how long to sleep until the next sweep
// is due, or to park: nothing has been in flight for parkAfter ticks.
func (s *Server) sweepStep(now time.Time, st *sweepState, w *sweepWork) (sleep time.Duration, park bool) {
	f := &s.flights
	tick := f.tickAt(now)
	f.tick.Store(tick)
	// A request arriving after this sweep is due answerWatchTicks from now
	// at the earliest (one that waits sooner wakes the sweep itself), so
	// the sweep never sleeps longer than that.
	next := tick + answerWatchTicks
	if s.active.Load() > 0 {
		st.idle = false
		deadlines := tick >= st.deadlinesAt
		if deadlines {
			st.deadlinesAt = tick + deadlineEvery
		}
		next = min(next, st.deadlinesAt, f.sweep(tick, now, deadlines, w))
		s.act(w)
	} else {
		if !st.idle {
			st.idle, st.idleSince = true, tick
		}
		if tick-st.idleSince >= parkAfter {
			return 0, true
		}
	}
	return f.epoch.Add(time.Duration(next) * sweepTick).Sub(now), false
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

// wakeSweep wakes a parked sweep: a request has arrived. (A request that
// begins to wait wakes it through reqCtx.waiting, parked or not.)
func (s *Server) wakeSweep() {
	if s.flights.parked.Load() {
		select {
		case s.flights.wake <- struct{}{}:
		default:
		}
	}
}
