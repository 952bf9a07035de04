package gateway

import (
	"context"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
)

// reqCtx is a proxied request's context: it ends when the client hangs up,
// the request times out, its first byte is late, the gateway shuts down, or
// the request finishes, and says which (cause).
//
// The standard library's way to the same semantics — WithCancelCause under
// a server-wide parent, WithTimeoutCause, an AfterFunc to release the
// reservation and another per upstream exchange — cost about ten
// allocations, a runtime timer and a registration in the parent's child set
// per request. reqCtx lives inside the exchange; its deadlines are checked
// by the server's sweep (inflight.go), shutdown reaches it through the set
// of requests in flight, and what must happen the moment it ends early —
// close the upstream connection (the backend aborts), give the reservation
// back — are fields it acts on rather than callbacks. Its done channel is
// made only when somebody asks for it (the admission queue does).
//
// It is a complete context.Context: contexts derived from it (a /tokenize
// timeout) are cancelled through its AfterFunc, without a goroutine each.
type reqCtx struct {
	deadline time.Time // arrival + server.request_timeout; immutable

	mu     sync.Mutex // guards the fields below
	done   chan struct{}
	cause  error             // why it ended; nil while it lives
	closer io.Closer         // an upstream connection to close when it ends
	ticket *admission.Ticket // a reservation to release when it ends
	// linger is how long the reservation stays held when the context ends
	// while an upstream exchange is open: the backend holds the request's
	// blocks until it notices the abort (admission.abort_hold).
	linger time.Duration
	// cut: preempt took the upstream connection to close it. The exchange
	// on it must not give it back to the pool (Uninterrupt says so), as it
	// would after its last byte had it not been cut.
	cut bool
	// resuming: preempt cut the upstream exchange for the request to be
	// resumed, which the relay asks once that exchange has ended.
	resuming bool
	funcs    []afterFunc // AfterFuncs of derived contexts
	nextID   int
	// waiting is told, without blocking, when the done channel is first
	// asked for: only a wait does that (the admission queue, a derived
	// context), and the server's sweep then watches the request's client
	// in time (inflight.go). nil: nobody is told.
	waiting chan<- struct{}
}

type afterFunc struct {
	id int
	f  func()
}

var (
	_ context.Context            = (*reqCtx)(nil)
	_ backends.Interrupter       = (*reqCtx)(nil)
	_ interface{ Cause() error } = (*reqCtx)(nil)
)

// closedChan is the done channel of a context that ended before anyone
// asked for one.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *reqCtx) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

func (c *reqCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		if c.cause != nil {
			return closedChan
		}
		c.done = make(chan struct{})
		if c.waiting != nil {
			select {
			case c.waiting <- struct{}{}:
			default: // the sweep is awake already
			}
		}
	}
	return c.done
}

// Err is what context.WithTimeoutCause and WithCancelCause would say:
// DeadlineExceeded for the request timeout, Canceled for every other end.
func (c *reqCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.cause {
	case nil:
		return nil
	case errRequestTimeout:
		return context.DeadlineExceeded
	}
	return context.Canceled
}

// Cause is why the context ended (errClientGone, errRequestTimeout,
// errFirstByteTimeout, errShutdown, context.Canceled once finished), nil
// while it lives.
func (c *reqCtx) Cause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cause
}

func (c *reqCtx) Value(any) any { return nil }

// cancel ends the context with cause, once: it closes the upstream
// connection held and releases the reservation held, in the calling
// goroutine (a short, non-blocking piece of work), and runs derived
// contexts' AfterFuncs in goroutines of their own, as context.AfterFunc does.
func (c *reqCtx) cancel(cause error) {
	c.mu.Lock()
	if c.cause != nil {
		c.mu.Unlock()
		return
	}
	c.cause = cause
	if c.done != nil {
		close(c.done)
	}
	closer, t, funcs := c.closer, c.ticket, c.funcs
	c.closer, c.ticket, c.funcs = nil, nil, nil
	c.mu.Unlock()
	if closer != nil {
		closer.Close()
	}
	switch {
	case t == nil:
	case closer != nil:
		t.Linger(c.linger)
	default:
		t.Release()
	}
	for _, a := range funcs {
		go a.f()
	}
}

// preempt ends the request's upstream exchange but not the request: it
// closes the upstream connection and gives up the reservation held, which
// lingers as on an end (the backend holds the blocks until it notices the
// abort), while the context lives on for another exchange (resume.go).
// False, doing nothing, when the context has ended or holds no upstream
// exchange to cut.
func (c *reqCtx) preempt() bool {
	c.mu.Lock()
	if c.cause != nil || c.closer == nil {
		c.mu.Unlock()
		return false
	}
	closer, t := c.closer, c.ticket
	c.closer, c.ticket, c.cut, c.resuming = nil, nil, true, true
	c.mu.Unlock()
	closer.Close()
	if t != nil {
		t.Linger(c.linger)
	}
	return true
}

// cutToResume says whether preempt cut the upstream exchange since
// stopped was last asked, and leaves it so.
func (c *reqCtx) cutToResume() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resuming
}

// stopped says whether preempt cut the upstream exchange since it was
// last asked, and forgets it.
func (c *reqCtx) stopped() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.resuming
	c.resuming = false
	return s
}

// releaseOnEnd has t released the moment the context ends (at once if it
// has): an ended request's upstream exchange is closed then and the backend
// frees its blocks, so the reservation goes back then too — not when a
// relay blocked on a slow client finally returns. Release is idempotent.
func (c *reqCtx) releaseOnEnd(t *admission.Ticket) {
	if c.lockLive() {
		c.ticket = t
		c.mu.Unlock()
		return
	}
	t.Release()
}

// Interrupt has cl closed the moment the context ends, at once if it has
// ended (backends.Interrupter). One connection is held at a time.
func (c *reqCtx) Interrupt(cl io.Closer) {
	if c.lockLive() {
		c.closer = cl
		c.mu.Unlock()
		return
	}
	cl.Close()
}

// lockLive locks mu and reports true if the context lives; else it
// reports false with mu unlocked.
func (c *reqCtx) lockLive() bool {
	c.mu.Lock()
	if c.cause == nil {
		return true
	}
	c.mu.Unlock()
	return false
}

// Uninterrupt forgets the connection held; false if the context ended
// first, or preempt cut the exchange, either of which closed it.
func (c *reqCtx) Uninterrupt() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closer = nil
	cut := c.cut
	c.cut = false
	return c.cause == nil && !cut
}

// AfterFunc is what context.AfterFunc, WithCancel and WithTimeout use on a
// parent that has it, instead of a goroutine that waits for Done.
func (c *reqCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	if c.cause != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	c.nextID++
	id := c.nextID
	c.funcs = append(c.funcs, afterFunc{id: id, f: f})
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.IndexFunc(c.funcs, func(a afterFunc) bool { return a.id == id })
		if i < 0 {
			return false
		}
		c.funcs = slices.Delete(c.funcs, i, i+1)
		return true
	}
}
