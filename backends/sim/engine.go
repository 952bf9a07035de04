package sim

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/kvbudget"
)

// Request outcomes as the handler sees them (request.status).
const (
	statusActive int32 = iota
	statusFinished
	statusFailed
)

// Where a request is, as the engine sees it (request.state, under engine.mu).
type reqState uint8

const (
	stateNew reqState = iota
	stateWaiting
	stateRunning
	stateDone // finished, failed or aborted: holds nothing
)

var (
	errUnhealthy  = errors.New("the engine is restarting after CUDA out of memory")
	errShutdown   = errors.New("the server is shutting down")
	errClientGone = errors.New("the client closed the connection; request aborted")
)

// sequence is one of a request's n completions.
type sequence struct {
	target int    // tokens it will generate; immutable
	key    uint64 // its text; immutable

	gen int   // tokens generated so far (engine.mu)
	own int64 // blocks it holds beyond the request's shared prompt blocks (engine.mu)

	// With the prefix cache, under engine.mu: the hash state of its block
	// being filled, the hashes of its full blocks past the prompt's (kept
	// across preemption, so that a recomputation can find them), and which
	// of the blocks it holds are cache entries (the rest of own is
	// anonymous).
	hstate uint64
	hashes []uint64
	cached []int32

	pub atomic.Int32 // gen, published to the handler after each step
}

// request is one completion request: n sequences over one prompt. The
// handler owns it before submit and reads only status, err, pub and wake
// after; the engine owns the rest under its mutex.
type request struct {
	prompt    int // prompt tokens
	maxTokens int
	arrival   time.Time
	seqs      []sequence
	wake      chan struct{} // capacity 1: the engine made progress on this request
	// pooling: an embedding, score or classification request, whose one
	// step is its prefill; it holds blocks for its prompt only (no slot for
	// a token to decode) and generates nothing.
	pooling bool

	// What the prefix cache knows of the prompt, immutable: the chained
	// hashes of its full blocks and the hash state of the tokens after them.
	// A request that is not cacheable (the cache is off, or a test made it
	// without tokens) never hits and is never found.
	cacheable bool
	hashes    []uint64
	tailState uint64
	promptIDs []uint32 // the prompt's token ids, kept only for KV events

	// Guarded by engine.mu.
	state      reqState
	shared     int64   // full prompt blocks, shared by the sequences
	cached     []int32 // which of them are prefix cache entries
	live       int     // sequences still generating
	admitted   bool    // admitted at least once (prompt tokens counted)
	firstToken time.Time

	status atomic.Int32 // statusActive until it ends
	err    error        // why it failed; written before status becomes statusFailed
}

// reachedMax says whether every sequence generated max_tokens, which is
// what makes vLLM report finished_reason "length" (see finishReason).
func (r *request) reachedMax() bool {
	if r.pooling {
		return false // vLLM ends a pooling request as stopped
	}
	for i := range r.seqs {
		if r.seqs[i].target < r.maxTokens {
			return false
		}
	}
	return true
}

func newRequest(promptTokens, maxTokens int, n int, arrival time.Time) *request {
	r := &request{prompt: promptTokens, maxTokens: maxTokens, arrival: arrival,
		seqs: make([]sequence, n), live: n, wake: make(chan struct{}, 1)}
	return r
}

func (r *request) notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// engineHooks are what the engine reports outside itself; nil fields are
// skipped. They run under engine.mu and must not call back into the engine.
type engineHooks struct {
	finished func(r *request, now time.Time)
	oom      func(err error)
}

// engine is vLLM's scheduler and block manager over a simulated GPU: a pool
// of KV blocks, a FIFO waiting queue and a running batch. One step decodes
// one token for every running sequence, after admitting what fits.
//
// Block accounting, the invariant every test checks: a running request holds
// shared + Σ own blocks, where shared = prompt/BlockSize full prompt blocks
// and a sequence that has generated g tokens (or will have after the step
// being planned) has own = Blocks(prompt+g) − shared; used is the sum over the
// running requests and never exceeds the pool. Waiting and finished requests
// hold nothing. With the prefix cache (prefixcache.go) a block that is a
// cache entry may be held by several running requests and is counted in used
// once, while its reference count is above zero; idle entries are free and
// stay findable until an allocation evicts them, least recently freed first.
//
// Lock order: engine.mu is a leaf; hooks run under it and take no engine
// lock.
type engine struct {
	s     *settings
	now   func() time.Time
	hooks engineHooks
	kick  chan struct{} // capacity 1: new work for the loop
	cache *prefixCache  // nil: prefix caching is off

	mu             sync.Mutex
	waiting        []*request // FIFO; preempted requests go back to the front
	running        []*request // in order of (re)admission: the last is the newest
	runningSeqs    int
	used, peak     int64
	preemptions    int64
	oomEvents      int64
	promptTokens   int64
	genTokens      int64
	cacheQueries   int64     // prompt tokens looked up in the prefix cache
	cacheHits      int64     // of those, tokens found
	hitBuf         []int32   // scratch of the admission being planned: entries hit
	seqHits        []int     // scratch: entries hit past the prompt, per sequence
	events         *eventLog // what the cache's changes are published as; nil: off
	unhealthyUntil time.Time
	planned        bool // a step is planned and not yet committed
	closed         bool // shut down: nothing is admitted any more
	// Requests ended, by vLLM's finished_reason: stop (a sequence ended
	// before max_tokens), length (every sequence reached it), abort (the
	// client left, or an out-of-memory event or shutdown failed it).
	finishedStop   int64
	finishedLength int64
	aborted        int64
}

func newEngine(s *settings, now func() time.Time, hooks engineHooks) *engine {
	e := &engine{s: s, now: now, hooks: hooks, kick: make(chan struct{}, 1)}
	if s.prefixCaching {
		e.cache = newPrefixCache()
		if s.kvEvents != nil {
			e.events = newEventLog(s.kvEvents.BufferSteps)
			e.cache.onEvict = e.removedLocked
		}
	}
	return e
}

func (e *engine) blocks(tokens int) int64 { return kvbudget.Blocks(tokens, e.s.blockSize) }

// healthyLocked says whether the engine accepts requests at now.
func (e *engine) healthyLocked(now time.Time) bool { return !now.Before(e.unhealthyUntil) }

func (e *engine) healthy() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.healthyLocked(e.now())
}

// submit queues r. It fails, leaving nothing behind, while the engine
// restarts after an out-of-memory event and once it has shut down.
func (e *engine) submit(r *request) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return errShutdown
	}
	if !e.healthyLocked(e.now()) {
		e.mu.Unlock()
		return errUnhealthy
	}
	r.state = stateWaiting
	e.waiting = append(e.waiting, r)
	e.mu.Unlock()
	select {
	case e.kick <- struct{}{}:
	default:
	}
	return nil
}

// abort drops r wherever it is and frees its blocks at once, as vLLM aborts
// a request whose client went away. It is a no-op for a request that ended.
func (e *engine) abort(r *request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.abortLocked(r)
}

func (e *engine) abortLocked(r *request) {
	switch r.state {
	case stateWaiting:
		e.waiting = removeReq(e.waiting, r)
		e.aborted++
	case stateRunning:
		e.running = removeReq(e.running, r)
		e.runningSeqs -= r.live
		e.freeLocked(r)
		e.aborted++
	}
	r.state = stateDone
}

// cancel is abort for a request whose handler is waiting on it: the
// request fails with err and its handler wakes. It is a no-op for a request
// that has already ended, so a late cancel never turns a finished request
// into a failed one.
func (e *engine) cancel(r *request, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.state == stateDone {
		return
	}
	e.abortLocked(r)
	r.err = err
	r.status.Store(statusFailed)
	r.notify()
}

func removeReq(q []*request, r *request) []*request {
	if i := slices.Index(q, r); i >= 0 {
		q = slices.Delete(q, i, i+1)
	}
	return q
}

// preemptLocked frees the newest running request and puts it at the front of
// the waiting queue, to be recomputed (prompt and what it generated so far)
// when it is admitted again: vLLM's preemption by recompute.
func (e *engine) preemptLocked() *request {
	v := e.running[len(e.running)-1]
	e.running = e.running[:len(e.running)-1]
	e.runningSeqs -= v.live
	e.freeLocked(v)
	v.state = stateWaiting
	e.waiting = slices.Insert(e.waiting, 0, v)
	e.preemptions++
	return v
}

// oomLocked fails everything in flight, frees the pool and makes the engine
// unhealthy for OOMRestart: what a server whose GPU ran out of memory does.
func (e *engine) oomLocked(now time.Time, need int64) {
	e.oomEvents++
	err := fmt.Errorf("CUDA out of memory. Tried to allocate %s (GPU 0; %s total capacity; %s of KV cache in %d blocks all in use by %d requests)",
		kvbudget.FormatBytes(need*e.s.layout.BytesPerBlock), kvbudget.FormatBytes(e.s.gpuMemory),
		kvbudget.FormatBytes(e.used*e.s.layout.BytesPerBlock), e.used, len(e.running)+len(e.waiting))
	e.failAllLocked(err)
	e.unhealthyUntil = now.Add(e.s.scaled(e.s.pace.oomRestart))
	if e.hooks.oom != nil {
		e.hooks.oom(err)
	}
}

// failAllLocked ends every request in flight with err.
func (e *engine) failAllLocked(err error) {
	for _, q := range [][]*request{e.running, e.waiting} {
		for _, r := range q {
			e.freeLocked(r)
			e.aborted++
			r.state = stateDone
			r.err = err
			r.status.Store(statusFailed)
			r.notify()
		}
	}
	e.running, e.waiting = e.running[:0], e.waiting[:0]
	e.runningSeqs = 0
}

// plan schedules the next step as vLLM does and returns its simulated
// duration; ok is false when there is nothing to run.
//
// First every running request, oldest first, gets the blocks for its next
// token; when the pool has none left, the newest running request is
// preempted (oom mode: the engine fails instead). Then, unless something was
// preempted in this step, waiting requests are admitted in FIFO order while
// the head fits: max_num_seqs, and its blocks leaving the watermark free. In
// oom mode everything waiting is admitted, fit or not.
func (e *engine) plan() (d time.Duration, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.cutEventsLocked()
	return e.planLocked(e.now())
}

func (e *engine) planLocked(now time.Time) (time.Duration, bool) {
	free := func() int64 { return e.s.numBlocks - e.used }
	preempted := false
	for i := 0; i < len(e.running); i++ {
		r := e.running[i]
		need := e.growthLocked(r)
		for need > free() {
			if e.s.oom {
				e.oomLocked(now, need)
				return 0, false
			}
			preempted = true
			if e.preemptLocked() == r {
				break
			}
		}
		if r.state != stateRunning {
			break // r preempted itself: it was the newest
		}
		e.growLocked(r)
	}
	prefill := 0
	// vLLM admits nothing in a step that preempted; but a batch that
	// preempted itself empty must take its own victim back.
	for (!preempted || len(e.running) == 0) && len(e.waiting) > 0 {
		r := e.waiting[0]
		need, compute, hits := e.lookupLocked(r)
		if e.s.oom {
			if need > free() {
				e.oomLocked(now, need)
				return 0, false
			}
		} else if e.runningSeqs+r.live > e.s.maxNumSeqs || free()-need < e.s.watermark {
			break
		}
		e.waiting = e.waiting[1:]
		e.admitLocked(r, hits)
		r.state = stateRunning
		e.running = append(e.running, r)
		e.runningSeqs += r.live
		prefill += compute
		if !r.admitted {
			r.admitted = true
			e.promptTokens += int64(r.prompt)
			if e.cache != nil {
				// As vLLM counts them: in tokens, the prompt looked up and
				// the full blocks of it found. vLLM counts each look-up, also
				// of a request that then does not fit; the simulator counts
				// one per request, when it is admitted, and none for the
				// recomputation of a preempted one (vLLM keeps those apart).
				e.cacheQueries += int64(r.prompt)
				e.cacheHits += int64(hits * e.s.blockSize)
			}
		}
	}
	if len(e.running) == 0 {
		return 0, false
	}
	e.planned = true
	d := e.s.pace.stepBase + time.Duration(e.runningSeqs)*e.s.pace.stepPerSeq + time.Duration(prefill)*e.s.pace.prefillPer
	return d, true
}

// commit ends the planned step: every running sequence gains the token its
// blocks were taken for; finished sequences free their own blocks at once,
// finished requests everything.
func (e *engine) commit() {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.cutEventsLocked()
	e.commitLocked(e.now())
}

func (e *engine) commitLocked(now time.Time) {
	if !e.planned {
		return
	}
	e.planned = false
	kept := e.running[:0]
	for _, r := range e.running {
		for i := range r.seqs {
			sq := &r.seqs[i]
			if sq.gen >= sq.target {
				continue
			}
			sq.gen++
			if !r.pooling {
				e.genTokens++
			}
			if r.cacheable && e.cache != nil {
				e.fillLocked(r, sq)
			}
			sq.pub.Store(int32(sq.gen))
			if sq.gen == sq.target {
				e.releaseLocked(sq.own, sq.cached)
				sq.own, sq.cached = 0, sq.cached[:0]
				r.live--
				e.runningSeqs--
			}
		}
		if r.firstToken.IsZero() {
			r.firstToken = now
		}
		if r.live == 0 {
			e.freeLocked(r)
			if r.reachedMax() {
				e.finishedLength++
			} else {
				e.finishedStop++
			}
			r.state = stateDone
			r.status.Store(statusFinished)
			if e.hooks.finished != nil {
				e.hooks.finished(r, now)
			}
		} else {
			kept = append(kept, r)
		}
		r.notify()
	}
	clear(e.running[len(kept):])
	e.running = kept
}

// step plans and commits one step at once, without waiting: for tests and
// for a free engine.
func (e *engine) step() (time.Duration, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.cutEventsLocked()
	now := e.now()
	d, ok := e.planLocked(now)
	if ok {
		e.commitLocked(now)
	}
	return d, ok
}

// run steps the engine until stop closes, sleeping each step's duration
// times TimeScale. Sleeps are paced against a deadline so that the short
// steps of a small TimeScale keep their average rate although each sleep
// overshoots. It paces on the wall clock, not e.now: the simulator stands
// in for a GPU that answers its clients in real time (scaled); tests that
// want no wall time step the engine themselves (step).
func (e *engine) run(stop <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var next time.Time
	for {
		d, ok := e.plan()
		if !ok {
			select {
			case <-e.kick:
				continue
			case <-stop:
				return
			}
		}
		if wall := e.s.scaled(d); wall > 0 {
			now := time.Now() // wall time: the pace of a real GPU (see above)
			if now.Sub(next) > 20*time.Millisecond {
				next = now // idle or far behind: do not bank the lost time
			}
			next = next.Add(wall)
			if sleep := next.Sub(now); sleep > 0 {
				timer.Reset(sleep)
				select {
				case <-timer.C:
				case <-stop:
					timer.Stop()
					return
				}
			}
		} else {
			select {
			case <-stop:
				return
			default:
			}
		}
		e.commit()
	}
}

// Stats is a snapshot of the simulated server.
type Stats struct {
	NumGPUBlocks     int64 // blocks in the KV pool
	BlockSize        int   // tokens per block
	UsedBlocks       int64 // blocks held by running requests now
	PeakUsedBlocks   int64 // most blocks ever held at once
	Running          int   // requests in the running batch
	Waiting          int   // requests queued, preempted ones included
	Preemptions      int64 // requests preempted (recompute), in all
	OOMEvents        int64 // out-of-memory events (oom mode), in all
	PromptTokens     int64 // prompt tokens of admitted requests, counted once each
	GenerationTokens int64 // tokens generated, recomputation not counted again
	// Prefix cache look-ups of admitted requests, in prompt tokens, and the
	// tokens found; both 0 with the cache off.
	PrefixCacheQueries int64
	PrefixCacheHits    int64
	CachedIdleBlocks   int64 // free blocks that still hold a cached prefix
	FinishedStop       int64 // requests ended with a sequence short of max_tokens
	FinishedLength     int64 // requests whose every sequence reached max_tokens
	Aborted            int64 // requests ended by a hang-up, an OOM event or shutdown
	Healthy            bool  // false while restarting after an OOM event
}

func (e *engine) stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	var idle int64
	if e.cache != nil {
		idle = e.cache.idle
	}
	return Stats{
		NumGPUBlocks: e.s.numBlocks, BlockSize: e.s.blockSize,
		UsedBlocks: e.used, PeakUsedBlocks: e.peak,
		Running: len(e.running), Waiting: len(e.waiting),
		Preemptions: e.preemptions, OOMEvents: e.oomEvents,
		PromptTokens: e.promptTokens, GenerationTokens: e.genTokens,
		PrefixCacheQueries: e.cacheQueries, PrefixCacheHits: e.cacheHits,
		FinishedStop: e.finishedStop, FinishedLength: e.finishedLength, Aborted: e.aborted,
		CachedIdleBlocks: idle, Healthy: e.healthyLocked(e.now()),
	}
}

// shutdown fails whatever is still in flight and refuses what comes after.
func (e *engine) shutdown() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.failAllLocked(errShutdown)
}
