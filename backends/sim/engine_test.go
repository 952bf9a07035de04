package sim

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvbudget"
)

const llamaBlockBytes = 2 << 20 // Llama-3-8B, bf16, 16 tokens a block

// poolConfig is a Config whose KV cache holds exactly blocks blocks of the
// built-in Llama-3-8B: 1 byte of weights, the default reserve, utilization 1.
func poolConfig(blocks int64) Config {
	return Config{
		GPUMemory:            kvbudget.DefaultReserve + 1 + blocks*llamaBlockBytes,
		GPUMemoryUtilization: 1,
		WeightsBytes:         1,
		MaxModelLen:          256,
	}
}

func testSettings(t testing.TB, c Config) *settings {
	t.Helper()
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// manualClock is the engine's time in hand-stepped tests.
type manualClock struct{ t time.Time }

func (c *manualClock) now() time.Time          { return c.t }
func (c *manualClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestEngine(t *testing.T, c Config) (*engine, *manualClock) {
	t.Helper()
	clk := &manualClock{t: time.Unix(1_700_000_000, 0)}
	return newEngine(testSettings(t, c), clk.now, engineHooks{}), clk
}

// req is a request of n sequences that each generate exactly out tokens.
func req(prompt, out, n int) *request {
	r := newRequest(prompt, out, n, time.Time{})
	for i := range r.seqs {
		r.seqs[i].target = out
	}
	return r
}

func mustSubmit(t *testing.T, e *engine, rs ...*request) {
	t.Helper()
	for _, r := range rs {
		if err := e.submit(r); err != nil {
			t.Fatal(err)
		}
	}
}

// checkHeld verifies the accounting invariant: used is the sum of what the
// running requests hold, each holding exactly its shared prompt blocks plus
// Blocks(prompt+gen)−shared per unfinished sequence.
func checkHeld(t *testing.T, e *engine) {
	t.Helper()
	var sum int64
	for _, r := range e.running {
		shared := int64(r.prompt / e.s.blockSize)
		if r.shared != shared {
			t.Fatalf("request holds %d shared blocks, want %d", r.shared, shared)
		}
		sum += r.shared
		for i := range r.seqs {
			sq := &r.seqs[i]
			want := int64(0)
			if sq.gen < sq.target {
				want = kvbudget.Blocks(r.prompt+sq.gen, e.s.blockSize) - shared
			}
			if sq.own != want {
				t.Fatalf("sequence with prompt %d and %d generated holds %d own blocks, want %d", r.prompt, sq.gen, sq.own, want)
			}
			sum += sq.own
		}
	}
	for _, r := range e.waiting {
		if r.shared != 0 || r.seqs[0].own != 0 {
			t.Fatalf("a waiting request holds blocks")
		}
	}
	if sum != e.used {
		t.Fatalf("used = %d, but the running requests hold %d", e.used, sum)
	}
	if e.used > e.s.numBlocks {
		t.Fatalf("used %d > pool %d", e.used, e.s.numBlocks)
	}
}

func TestBlockAccountingAtBoundaries(t *testing.T) {
	tests := []struct{ prompt, out, n int }{
		{1, 1, 1}, {15, 1, 1}, {15, 2, 1}, {16, 1, 1}, {16, 16, 1}, {17, 15, 1}, {17, 16, 1},
		{31, 3, 1}, {32, 33, 1}, {33, 31, 1}, {100, 60, 1},
		{16, 17, 2}, {17, 15, 3}, {32, 1, 4}, {40, 40, 2},
	}
	for _, tc := range tests {
		e, _ := newTestEngine(t, poolConfig(64))
		r := req(tc.prompt, tc.out, tc.n)
		mustSubmit(t, e, r)
		l := e.s.layout
		for g := 1; g <= tc.out; g++ {
			if _, ok := e.step(); !ok {
				t.Fatalf("%+v: nothing to run at token %d", tc, g)
			}
			checkHeld(t, e)
			if g < tc.out {
				// n sequences of prompt+g tokens sharing the prompt's full blocks.
				if want := l.RequestBlocks(tc.prompt, g, tc.n); e.used != want {
					t.Fatalf("%+v: after %d tokens used = %d blocks, want %d", tc, g, e.used, want)
				}
			}
		}
		if e.used != 0 || r.status.Load() != statusFinished {
			t.Fatalf("%+v: finished with %d blocks used, status %d", tc, e.used, r.status.Load())
		}
		if want := l.RequestBlocks(tc.prompt, tc.out, tc.n); e.peak != want {
			t.Errorf("%+v: peak = %d blocks, want kvbudget's RequestBlocks %d", tc, e.peak, want)
		}
		if got := int(r.seqs[0].pub.Load()); got != tc.out {
			t.Errorf("%+v: published %d tokens, want %d", tc, got, tc.out)
		}
		if _, ok := e.step(); ok {
			t.Errorf("%+v: a step ran with nothing left", tc)
		}
	}
}

func TestEarlyFinishFreesOwnBlocks(t *testing.T) {
	e, _ := newTestEngine(t, poolConfig(64))
	r := req(32, 40, 2)
	r.seqs[0].target = 5 // this one stops early
	mustSubmit(t, e, r)
	for range 5 {
		e.step()
	}
	checkHeld(t, e)
	// 2 shared + the long sequence's own Blocks(37)−2 = 1; the short one freed its own.
	if e.used != 3 || r.live != 1 {
		t.Fatalf("used = %d, live = %d; want 3 blocks, 1 live sequence", e.used, r.live)
	}
	for r.status.Load() == statusActive {
		e.step()
		checkHeld(t, e)
	}
	if e.used != 0 {
		t.Fatalf("used = %d after the end", e.used)
	}
}

func TestAdmissionMaxNumSeqs(t *testing.T) {
	c := poolConfig(200)
	c.MaxNumSeqs = 3
	e, _ := newTestEngine(t, c)
	rs := []*request{req(1, 5, 1), req(1, 5, 1), req(1, 5, 1), req(1, 5, 1), req(1, 5, 1)}
	mustSubmit(t, e, rs...)
	e.step()
	if len(e.running) != 3 || len(e.waiting) != 2 || e.waiting[0] != rs[3] || e.waiting[1] != rs[4] {
		t.Fatalf("running %d, waiting %d; want the first 3 running, the others queued in order", len(e.running), len(e.waiting))
	}
	// n counts against max_num_seqs: a request of 2 sequences waits for 2 free slots.
	e2, _ := newTestEngine(t, c)
	mustSubmit(t, e2, req(1, 5, 2), req(1, 5, 2))
	e2.step()
	if e2.runningSeqs != 2 || len(e2.waiting) != 1 {
		t.Fatalf("running %d sequences, %d waiting; want 2 and 1", e2.runningSeqs, len(e2.waiting))
	}
}

func TestAdmissionIsFIFOWithoutSkipping(t *testing.T) {
	e, _ := newTestEngine(t, poolConfig(200))
	var fills []*request
	for range 12 {
		fills = append(fills, req(254, 2, 1)) // 16 blocks from admission to the end
	}
	mustSubmit(t, e, fills...)
	e.step()
	if e.used != 192 {
		t.Fatalf("used %d, want 192", e.used)
	}
	head, small := req(254, 2, 1), req(1, 1, 1)
	mustSubmit(t, e, head, small)
	e.step() // head needs 16 of 8 free: it waits, and so does the small one behind it
	checkHeld(t, e)
	if len(e.waiting) != 2 || e.waiting[0] != head {
		t.Fatalf("waiting %d; want head and small still queued in order", len(e.waiting))
	}
	e.step() // the fills finished last step; both are admitted now
	if head.state != stateRunning && head.state != stateDone || small.state != stateDone && small.state != stateRunning {
		t.Fatal("the queue did not drain once room was free")
	}
}

func TestWatermarkHoldsBackAdmission(t *testing.T) {
	for _, tc := range []struct {
		blocks int64
		admit  bool
	}{{188, true}, {189, false}} {
		c := poolConfig(200) // watermark: 2 blocks
		c.MaxModelLen = 3168
		e, _ := newTestEngine(t, c)
		if e.s.watermark != 2 {
			t.Fatalf("watermark = %d, want 2", e.s.watermark)
		}
		mustSubmit(t, e, req(150, 5, 1)) // 10 blocks throughout
		e.step()
		// The candidate takes Blocks(prompt+1) = tc.blocks of the 190 free.
		cand := req(int(tc.blocks)*16-1, 1, 1)
		mustSubmit(t, e, cand)
		e.step()
		if admitted := cand.state != stateWaiting; admitted != tc.admit {
			t.Errorf("request of %d blocks with 190 free: admitted = %t, want %t (2 blocks of watermark)", tc.blocks, admitted, tc.admit)
		}
	}
}

func TestPreemptsNewestAndRecomputes(t *testing.T) {
	// 10 blocks, no watermark. a and b each start at 2 blocks and grow to 6:
	// together 12 > 10, so the newest (b) is preempted, recomputed later.
	c := poolConfig(10)
	c.MaxModelLen = 96
	e, _ := newTestEngine(t, c)
	a, b := req(20, 76, 1), req(20, 76, 1)
	mustSubmit(t, e, a)
	e.step()
	mustSubmit(t, e, b)
	for steps := 0; a.status.Load() == statusActive || b.status.Load() == statusActive; steps++ {
		if steps > 1000 {
			t.Fatal("no progress")
		}
		if _, ok := e.step(); !ok {
			t.Fatal("engine idle with work left")
		}
		checkHeld(t, e)
		if a.state == stateWaiting {
			t.Fatal("the older request was preempted, not the newest")
		}
	}
	if e.preemptions == 0 {
		t.Fatal("no preemption although the pool was oversubscribed")
	}
	if e.peak > e.s.numBlocks {
		t.Fatalf("peak %d > pool %d", e.peak, e.s.numBlocks)
	}
	for _, r := range []*request{a, b} {
		if r.status.Load() != statusFinished || r.seqs[0].pub.Load() != 76 {
			t.Fatalf("a request did not complete all its tokens")
		}
	}
	if e.used != 0 {
		t.Fatalf("used %d at the end", e.used)
	}
	// Recomputation does not count generated tokens twice.
	if e.genTokens != 152 || e.promptTokens != 40 {
		t.Fatalf("counted %d generated and %d prompt tokens, want 152 and 40", e.genTokens, e.promptTokens)
	}
}

func TestPreemptedGoesToFrontOfQueue(t *testing.T) {
	c := poolConfig(10)
	c.MaxModelLen = 96
	e, _ := newTestEngine(t, c)
	a, b := req(31, 60, 1), req(31, 60, 1)
	mustSubmit(t, e, a, b)
	for i := 0; e.preemptions == 0; i++ {
		if i > 100 {
			t.Fatal("no preemption")
		}
		e.step()
	}
	late := req(1, 1, 1)
	mustSubmit(t, e, late)
	if len(e.waiting) != 2 || e.waiting[0] != b || e.waiting[1] != late || a.state != stateRunning {
		t.Fatal("want a running and the waiting queue [b (preempted, newest), late]")
	}
}

func TestAbortFreesAtOnce(t *testing.T) {
	e, _ := newTestEngine(t, poolConfig(64))
	r, w := req(100, 100, 1), req(10, 10, 1)
	mustSubmit(t, e, r)
	e.step()
	if e.used == 0 {
		t.Fatal("nothing allocated")
	}
	e.abort(r)
	if e.used != 0 || len(e.running) != 0 {
		t.Fatalf("abort left %d blocks, %d running", e.used, len(e.running))
	}
	mustSubmit(t, e, w)
	e.abort(w) // still waiting
	if len(e.waiting) != 0 {
		t.Fatal("abort left a waiting request")
	}
	// Between plan and commit (the engine sleeping through a step).
	r2 := req(50, 10, 1)
	mustSubmit(t, e, r2)
	if _, ok := e.plan(); !ok {
		t.Fatal("nothing planned")
	}
	e.abort(r2)
	e.commit()
	if e.used != 0 || r2.seqs[0].pub.Load() != 0 {
		t.Fatal("an aborted request advanced or kept blocks")
	}
}

func TestOOMFailsEverythingAndRestarts(t *testing.T) {
	c := poolConfig(20)
	c.OnOverflow = OverflowOOM
	c.OOMRestart = 2 * time.Second
	c.TimeScale = 0.5
	e, clk := newTestEngine(t, c)
	var hookErr error
	e.hooks.oom = func(err error) { hookErr = err }
	// Three requests of 8 blocks at their largest: 24 > 20.
	rs := []*request{req(100, 28, 1), req(100, 28, 1), req(100, 28, 1)}
	mustSubmit(t, e, rs...)
	for i := 0; e.oomEvents == 0; i++ {
		if i > 100 {
			t.Fatal("no OOM")
		}
		e.step()
		checkHeld(t, e)
	}
	for _, r := range rs {
		if r.status.Load() != statusFailed || !strings.Contains(r.err.Error(), "CUDA out of memory") {
			t.Fatalf("request not failed with CUDA out of memory: %v", r.err)
		}
	}
	if e.used != 0 || len(e.running) != 0 || hookErr == nil {
		t.Fatalf("after OOM: %d blocks used, %d running", e.used, len(e.running))
	}
	if e.healthy() {
		t.Fatal("healthy right after OOM")
	}
	if err := e.submit(req(1, 1, 1)); !errors.Is(err, errUnhealthy) {
		t.Fatalf("submit while restarting = %v", err)
	}
	clk.advance(999 * time.Millisecond) // restart is 2s × TimeScale 0.5
	if e.healthy() {
		t.Fatal("healthy before the restart time")
	}
	clk.advance(time.Millisecond)
	if !e.healthy() {
		t.Fatal("not healthy after the restart time")
	}
	mustSubmit(t, e, req(1, 1, 1))
}

func TestOOMModeAdmitsWithinPool(t *testing.T) {
	c := poolConfig(16)
	c.OnOverflow = OverflowOOM
	e, _ := newTestEngine(t, c)
	// Two requests of exactly 8 blocks at their largest fill 16: no OOM.
	rs := []*request{req(100, 28, 1), req(100, 28, 1)}
	mustSubmit(t, e, rs...)
	for rs[0].status.Load() == statusActive || rs[1].status.Load() == statusActive {
		e.step()
		checkHeld(t, e)
	}
	if e.oomEvents != 0 || e.peak != 16 {
		t.Fatalf("oom events %d, peak %d; want 0 and a full pool", e.oomEvents, e.peak)
	}
}

func TestStepDuration(t *testing.T) {
	c := poolConfig(64)
	c.StepBase, c.StepPerSeq, c.PrefillPerToken = 10*time.Millisecond, time.Millisecond, 100*time.Microsecond
	e, _ := newTestEngine(t, c)
	mustSubmit(t, e, req(50, 3, 2))
	d, _ := e.step() // prefill of 50 tokens, 2 sequences
	if want := 10*time.Millisecond + 2*time.Millisecond + 5*time.Millisecond; d != want {
		t.Fatalf("prefill step = %v, want %v", d, want)
	}
	d, _ = e.step()
	if want := 12 * time.Millisecond; d != want {
		t.Fatalf("decode step = %v, want %v", d, want)
	}
}
