package gateway

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
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

// exchange is one proxied request from arrival to its last byte. It holds
// everything that must be given back — the admission ticket, the client
// watch, the request context — and finish gives it all back exactly once,
// whichever way the request leaves.
type exchange struct {
	s     *Server
	rt    *runtime
	start time.Time
	label string // model label for metrics ("" until the model is known)

	req    *request
	m      *model
	class  string
	tenant string

	// ctx is &rctx, the request's context (reqctx.go).
	ctx  context.Context
	rctx reqCtx
	fl   flight   // in the server's set of requests in flight
	conn net.Conn // the client's, watched for a hang-up once it waits

	wmu        sync.Mutex // guards watchStop and watchEnded
	watchStop  func() bool
	watchEnded bool // finished: the client is never watched again
	// stage lets a stream under way outlive a hang-up report (see
	// hangUp); the watch's goroutine reads and writes it too.
	stage atomic.Int32 // stageBefore, stageStreaming, stageHungUp or stageDone

	ticket *admission.Ticket // &ticketBuf once admitted
	res    reservation
	one    oneChoice // res's slices, for one prompt and one choice
	// ticketBuf is the admission held, in the exchange itself so that an
	// admission that fits at once allocates nothing.
	ticketBuf admission.Ticket
	backend   *backends.Backend

	predicted int // prompt tokens reserved, all prompts
	// counts and exact hold countPrompts' answer for a single prompt.
	counts    [1]int
	exact     [1]bool
	injectMax int // max_tokens the gateway adds to the body (the model's default); 0 = none
	// alias is the model's served_name the client sent ("" when it sent
	// the model's own name): the backend is sent req.model, the client
	// sees alias in answers; renames are the patterns renameModel swaps.
	alias    string
	renames  [][2][]byte
	firstTok bool
	lastTok  time.Time // the first choice's last token, for the inter-token latency
	usage    struct{ prompt, completion int }
	hasUsage bool
	// merges is the flag of the stream's backend that says its events
	// carry several tokens (tokencount.go); nil until first read.
	merges *atomic.Bool
	// cutBuf and eventBuf hold a chunk with its usage cut, and the event
	// relayed in its place.
	cutBuf, eventBuf []byte

	// source is how the prompts were counted (sourceBackend, ...); "" for
	// token ids only. A single prompt counted from the model's tokenize
	// cache keeps its key, to be checked against the usage reported.
	source     string
	cacheHit   bool
	cacheKey   tokenKey
	cacheCount int
	// chains name each prompt's leading full blocks (prefix.go) when a GPU
	// of the model shares them; nil where a prompt's were not seen.
	chains [][]uint64

	body      sseBody // a streamed answer, relayed as fasthttp writes it
	streaming bool    // the relay owns finish (set by the handler's goroutine only)

	// resume keeps what a stream needs to be resumed after the guard
	// stops it (resume.go); nil when it cannot be.
	resume *resumeState

	access accessRecord // accesslog.go
	// attempts counts the sends to a backend (a failover's and a resumed
	// stream's included); sentAt is when the last began.
	attempts int
	sentAt   time.Time
	trace    *reqTrace // trace.go; nil with tracing off

	done bool
}

func (s *Server) newExchange(ctx *fasthttp.RequestCtx, rt *runtime) *exchange {
	x := &exchange{s: s, rt: rt, start: s.now(), label: "unknown", conn: ctx.Conn()}
	x.rctx.deadline = x.start.Add(rt.cfg.Server.requestTimeout())
	x.rctx.waiting = s.wake
	x.rctx.linger = rt.cfg.Admission.abortHold()
	x.ctx = &x.rctx
	s.m.inflight.Inc()
	s.active.Add(1)
	s.flights.add(x)
	if s.stopping.Load() {
		x.rctx.cancel(errShutdown)
	}
	s.wakeSweep()
	return x
}

// watchClient has the client's hang-up end the request's context; the
// sweep calls it once the request waits (inflight.go). It holds wmu across
// the registration, which only the request's own finish waits for.
func (x *exchange) watchClient() {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	if x.watchEnded || x.conn == nil {
		return
	}
	if stop, err := x.s.watch.Watch(socketOf(x.conn), x.hangUp); err == nil {
		x.watchStop = stop
	}
}

// unwatch stops watching the client, for good.
func (x *exchange) unwatch() {
	x.wmu.Lock()
	x.watchEnded = true
	stop := x.watchStop
	x.watchStop = nil
	x.wmu.Unlock()
	if stop != nil {
		stop()
	}
}

// finish records the outcome and releases everything. Later calls do
// nothing, so every exit path may call it.
func (x *exchange) finish(outcome, reason string) {
	if x.done {
		return
	}
	x.done = true
	x.s.flights.remove(x)
	x.stopFirstByte()
	x.unwatch()
	if x.ticket != nil && x.rctx.Cause() == nil {
		// A context that ended first gave the ticket up itself, lingering
		// while the backend may still hold the blocks (reqctx.go).
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

// serveAdmitted serves a request of an admitted API: the steps every such
// request takes (steps.go), each as its API's entry (routes.go) says.
func (s *Server) serveAdmitted(ctx *fasthttp.RequestCtx, kind endpoint) {
	if s.testHookServe != nil {
		s.testHookServe()
	}
	a := &apis[kind]
	x := s.begin(ctx, kind)
	defer x.leave()

	tn, ok := x.readBody(ctx, kind, a.parse)
	if !ok {
		return
	}
	texts := a.texts
	if a.typed && x.m.converted.Load() {
		texts = nil // its backend counts them above their chat: estimated (usage.go)
	}
	prompts, exact, ok := x.count(ctx, tn, texts)
	if !ok || !a.reserve(x, ctx, prompts, exact) {
		return
	}
	areq := a.admission(x)
	if x.rt.cfg.Routing == routingAffinity {
		areq.Affinity = x.affinity(ctx)
	}
	body, err := x.outgoing(ctx)
	if err != nil {
		x.refuse(ctx, err)
		return
	}
	up, err := x.turn(areq, body, &ctx.Request.Header)
	x.queueHeader(ctx)
	if err != nil {
		x.refuse(ctx, err)
		return
	}
	x.answer(ctx, up)
}

// reserveCompletion is chat's and completions' reservation step.
func reserveCompletion(x *exchange, ctx *fasthttp.RequestCtx, prompts []int, exact []bool) bool {
	return x.reserved(ctx, x.reserve(prompts, exact))
}

// completionAdmission is how a chat or completion runs: a stream may be
// stopped by the guard, and resumed when its body can be continued.
func completionAdmission(x *exchange) admission.Request {
	req := x.req
	areq := admission.Request{Opaque: !req.stream, Pinned: req.pinned}
	if req.stream {
		areq.Stopper = x
		if req.resumable && x.rt.resumes() {
			x.resume = newResumeState()
		}
		// A tool call ends what a continuation can carry, found only
		// while the answer streams: such a request is taken as one that
		// cannot be resumed where admission decides up front. With
		// resume_stopped off every stop is a cut, which the operator
		// chose over holding streams at their worst case.
		areq.NoResume = x.rt.resumes() && (x.resume == nil || req.tools)
	}
	return areq
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
