package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/jsonscan"
)

// Causes of a request's context ending, told apart when it does.
var (
	errClientGone     = errors.New("client disconnected")
	errRequestTimeout = errors.New("request timeout")
	errShutdown       = errors.New("gateway shutting down")
	// errFirstByteTimeout: a streamed request's backend sent no event
	// within its first_byte_timeout.
	errFirstByteTimeout = errors.New("first byte timeout")
	// errStoppedForMemory: the admission guard stopped the request, so
	// that the GPU's KV cache stays within its budget when the requests
	// running there outgrew their forecast.
	errStoppedForMemory = errors.New("stopped to keep the GPU within its KV budget")
)

// exchange is one proxied request from arrival to its last byte: its
// life. It holds everything that must be given back — the admission
// ticket, the client watch (in its flight), the request context — and
// finish gives it all back exactly once, whichever way the request
// leaves. Its other roles are types of their own, embedded: the counting
// of its tokens (tally, tally.go), the relay of its stream (relay,
// relay.go), and what is recorded of it (records, records.go).
type exchange struct {
	s     *Server
	rt    *runtime
	start time.Time
	label string // model label for metrics ("unknown" until the model is known)

	req *request
	m   *model
	who // the tenant and class it is admitted as

	rctx reqCtx // the request's context (reqCtx, below)
	fl   flight // in the server's set of requests in flight, its client watched (inflight.go)

	hold                      // the admission held
	backend *backends.Backend // the backend sent to last

	tally
	relay
	records

	done bool
}

// who is the client a request is admitted for: its tenant (by its API
// key) and its priority class.
type who struct{ tenant, class string }

// hold is the admission a request holds: the ticket, in the exchange
// itself so that an admission that fits at once allocates nothing
// (ticketBuf), or a continuation's (loop.go: admit).
type hold struct {
	ticket    *admission.Ticket // &ticketBuf once admitted, or the continuation's
	ticketBuf admission.Ticket
}

func (s *Server) newExchange(ctx *fasthttp.RequestCtx, rt *runtime) *exchange {
	x := &exchange{s: s, rt: rt, start: s.now(), label: "unknown"}
	x.fl.watch.conn = ctx.Conn()
	x.rctx.deadline = x.start.Add(rt.cfg.Server.RequestTimeout.D)
	x.rctx.waiting = s.flights.wake
	x.rctx.linger = rt.cfg.Admission.AbortHold.D
	s.m.inflight.Inc()
	s.active.Add(1)
	s.flights.add(x)
	if s.life.stopping.Load() {
		x.rctx.cancel(errShutdown)
	}
	s.wakeSweep()
	return x
}

// watchClient has the client's hang-up end the request's context; the
// sweep calls it once the request waits (inflight.go).
func (x *exchange) watchClient() { x.fl.watch.start(x.s.watch, x.hangUp) }

// finish records the outcome and releases everything. Later calls do
// nothing, so every exit path may call it.
func (x *exchange) finish(outcome, reason string) {
	if x.done {
		return
	}
	x.done = true
	x.s.flights.remove(x)
	x.stopFirstByte()
	x.fl.watch.end()
	if x.ticket != nil && x.rctx.Cause() == nil {
		// A context that ended first gave the ticket up itself, lingering
		// while the backend may still hold the blocks (reqCtx).
		x.ticket.Release()
	}
	x.rctx.cancel(context.Canceled)
	m := x.s.m
	m.inflight.Dec()
	x.s.active.Add(-1)
	took := x.s.now().Sub(x.start)
	if x.m != nil && outcome == outcomeOK && reason == "" {
		ms := m.forModel(x.m.name)
		ms.ok.Inc()
		ms.okDur.Observe(took.Seconds())
	} else {
		m.requests.WithLabelValues(x.label, outcome, reason).Inc()
		m.duration.WithLabelValues(x.label, outcome).Observe(took.Seconds())
	}
	if x.hasUsage {
		x.recordUsage()
	}
	x.logAccess(outcome, reason, took)
	x.trace.end(x, outcome, reason, took)
	if x.resume != nil {
		x.resume.free() // the pointer stays: the guard may read it still
	}
}

// fail answers with e, when there is a client to answer, and finishes.
func (x *exchange) fail(ctx *fasthttp.RequestCtx, e *apiError, outcome, reason string) {
	if e != nil {
		e.write(ctx)
		if e.status == statusClientClosed {
			ctx.SetConnectionClose() // it sends nothing more
		}
	}
	x.finish(outcome, reason)
}

// failEnded finishes a request whose context ended, answering when there is
// still a client to answer.
func (x *exchange) failEnded(ctx *fasthttp.RequestCtx) bool {
	outcome, reason, e := x.ended()
	if outcome == "" {
		return false
	}
	x.fail(ctx, e, outcome, reason)
	return true
}

func (x *exchange) clientGone() { x.rctx.cancel(errClientGone) }

// StopForMemory is the admission guard stopping the request (see
// admission's guard.go). A stream that can be resumed has its upstream
// exchange cut and its reservation lingered until the backend has let the
// blocks go, and the relay sends it again when it fits (resume.go). Any
// other has its context end, which does the same and has the relay end
// the stream with an error event.
func (x *exchange) StopForMemory() {
	if x.resume != nil && x.rctx.preempt() {
		return
	}
	x.rctx.cancel(errStoppedForMemory)
}

// Resumable says whether the guard's stop would resume the stream rather
// than end it (admission.ResumableStopper): it is one kept to be resumed,
// and nothing it generated has taken that away yet.
func (x *exchange) Resumable() bool { return x.resume != nil && !x.resume.lost.Load() }

var _ admission.ResumableStopper = (*exchange)(nil)

// answer answers the client from the first turn's upstream: a whole
// answer is passed on as it is, a stream relayed (stream, relay.go), which
// then owns the exchange's finish.
func (x *exchange) answer(ctx *fasthttp.RequestCtx, up upstream) {
	copyBackendHeaders(ctx, up.resp)
	if up.er == nil {
		x.passBody(ctx, up.resp)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	x.streaming = true            // from here the relay owns finish
	x.stage.Store(stageStreaming) // see hangUp
	x.body = sseBody{x: x, up: up}
	if !ctx.Request.Header.IsHTTP11() {
		x.body.closeDelimited(ctx, x.rt.cfg.Server.WriteTimeout.D)
		return
	}
	ctx.Response.SetBodyStream(&x.body, -1)
}

// passBody relays a whole (non-streamed) answer: the backend's status and
// body as they are, its usage read on the way for calibration and metrics.
func (x *exchange) passBody(ctx *fasthttp.RequestCtx, resp *backends.Response) {
	defer resp.Release()
	bp := bodyBufs.Get().(*[]byte)
	body, err := resp.ReadInto((*bp)[:0], x.backend.MaxBody())
	defer func() {
		if cap(body) <= maxPooledBody {
			*bp = body[:0]
			bodyBufs.Put(bp)
		}
	}()
	if err != nil {
		x.refuse(ctx, err)
		return
	}
	status := resp.Status()
	ctx.SetStatusCode(status)
	if ct := resp.Header.ContentType(); len(ct) > 0 {
		ctx.Response.Header.SetContentTypeBytes(ct)
	}
	ctx.SetBody(x.renameModel(body))
	switch {
	case status < 300:
		p := x.s.parsers.Get()
		if v, err := p.ParseBytes(body); err == nil {
			x.readUsage(v.Get("usage"))
			x.learnWhole(v)
		}
		x.s.parsers.Put(p)
		x.finish(outcomeOK, "")
	case status >= 500:
		x.s.m.upstreamErrors.WithLabelValues(x.backend.Name(), "status").Inc()
		if bytes.Contains(body, outOfMemory) {
			x.overflowed()
		}
		x.finish(outcomeFailed, "backend_"+strconv.Itoa(status))
	default:
		x.finish(outcomeRejected, "backend_"+strconv.Itoa(status))
	}
}

// bodyBufs are the buffers non-streamed answers are read into before
// fasthttp copies them into the response; one of up to maxPooledBody bytes
// goes back for the next answer.
var bodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

const maxPooledBody = 1 << 20

// copyBackendHeaders passes on the backend's headers a client may act on.
// Their names are compared as fasthttp normalizes them (Peek would copy
// each name into the header's buffer first). The backend's X-Request-Id is
// not among them: the client keeps the gateway's, which the backend was
// sent and the access log holds.
func copyBackendHeaders(ctx *fasthttp.RequestCtx, resp *backends.Response) {
	for k, v := range resp.Header.All() {
		if len(v) > 0 && string(k) == "Retry-After" {
			ctx.Response.Header.SetCanonical(k, v)
		}
	}
}

// renameModel gives the client back the model name it sent (served_name)
// where the backend's answer names its own: the "model" member of a body
// or of a stream's event. A member's quotes in a JSON string value would be
// escaped, so the pattern cannot match inside the generated text. Without
// an alias it returns b as it is, allocating nothing.
func (x *exchange) renameModel(b []byte) []byte {
	if x.req.alias == "" {
		return b
	}
	if x.req.renames == nil {
		from, to := jsonscan.AppendString(nil, x.req.model), jsonscan.AppendString(nil, x.req.alias)
		for _, sep := range []string{`"model":`, `"model": `} {
			x.req.renames = append(x.req.renames, [2][]byte{append([]byte(sep), from...), append([]byte(sep), to...)})
		}
	}
	for _, r := range x.req.renames {
		b = bytes.ReplaceAll(b, r[0], r[1])
	}
	return b
}

// outOfMemory is what the error of a backend that ran out of KV blocks
// says (PyTorch's "CUDA out of memory", the simulator's too).
var outOfMemory = []byte("out of memory")

// overflowed tells admission that the request's GPU ran out of memory:
// every forecast made for it is distrusted for the cool-down.
func (x *exchange) overflowed() {
	if x.ticket == nil || x.rt.count {
		return
	}
	id := x.ticket.GPU()
	x.rt.sched.Overflowed(id)
	gpu := id
	if g := x.rt.gpuByID[id]; g != nil {
		gpu = g.name
	}
	x.s.m.overflows.WithLabelValues(gpu).Inc()
	x.s.gpuOutOfMemory(x.rt, gpu)
	x.s.log.Warn("a backend ran out of KV memory: the GPU goes to worst-case admission for the cool-down", "gpu", gpu, "backend", x.backend.Name())
}

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
