package admission_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// stops records which requests the guard stopped, in order.
type stops struct {
	mu  sync.Mutex
	got []string
}

type stopper struct {
	name string
	log  *stops
}

func (s stopper) StopForMemory() {
	s.log.mu.Lock()
	s.log.got = append(s.log.got, s.name)
	s.log.mu.Unlock()
}

func (s *stops) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// guarded is a predicted scheduler that has learned that every output
// stops at 20 tokens, with exposure and cool-down out of the way unless a
// test sets them.
func guarded(t *testing.T, capacity int64, edit func(*admission.Config)) *fixture {
	cfg := predicted(capacity, 100)
	cfg.Policy.MaxOvercommit = 1000
	cfg.Classes = []admission.ClassConfig{{Name: "standard"}, {Name: "sheddable", Sheddable: new(false)}}
	cfg.Tenants = []admission.TenantConfig{{Name: "a", Share: 0.5}, {Name: "b", Share: 0.5}}
	if edit != nil {
		edit(&cfg)
	}
	f := newFixture(t, cfg)
	f.teach(100, 20)
	return f
}

// When requests outgrow the forecast they were admitted on, the guard stops
// running ones before what the rest may hold passes the GPU — predicted
// ones first, the lowest class, then the tenant holding the most for its
// share, then the newest — and the forecast is distrusted.
func TestGuardStopsBeforeTheGPUIsExceeded(t *testing.T) {
	type running struct {
		name, class, tenant string
	}
	for _, tc := range []struct {
		name    string
		running []running // in admission order
		want    []string  // the first stopped
	}{
		{"the newest first", []running{{"r1", "", ""}, {"r2", "", ""}, {"r3", "", ""}, {"r4", "", ""}}, []string{"r4"}},
		{"the lowest class first", []running{{"shed", "sheddable", ""}, {"r2", "", ""}, {"r3", "", ""}, {"r4", "", ""}}, []string{"shed"}},
		{"the tenant most over its share", []running{{"a1", "", "a"}, {"a2", "", "a"}, {"a3", "", "a"}, {"b1", "", "b"}}, []string{"a3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Four requests of a 1024-token cap, 65 blocks of 16 bytes at
			// worst, on a GPU of 160 blocks: admitted on their forecast
			// (20 tokens), they would need 260 if they all ran long.
			f := guarded(t, 160*16, nil)
			log := &stops{}
			var tks []*admission.Ticket
			for _, r := range tc.running {
				rq := chat(16, 1024)
				rq.Class, rq.Tenant, rq.Stopper = r.class, r.tenant, stopper{r.name, log}
				tks = append(tks, f.acquire(rq))
			}
			for gen := 16; len(log.names()) == 0 && gen <= 1024; gen += 16 {
				for _, tk := range tks {
					tk.Progress(0, gen)
					ps := f.b.Scheduler.Stats().GPUs[0]
					if ps.Now-ps.Stopping > ps.Capacity {
						t.Fatalf("at %d tokens: what runs may hold %d of a capacity of %d", gen, ps.Now-ps.Stopping, ps.Capacity)
					}
				}
			}
			got := log.names()
			if len(got) == 0 || !slices.Equal(got[:len(tc.want)], tc.want) {
				t.Fatalf("stopped %v, want first %v", got, tc.want)
			}
			st := f.b.Scheduler.Stats()
			// The queue is distrusted: by the guard, or by the change
			// detector just before it (its requests outgrew their
			// forecast in a GPU with little room).
			if st.GuardStops != int64(len(got)) || st.Trips[admission.TripGuard]+st.Trips[admission.TripDrift] < 1 || !st.Queues[0].Distrusted {
				t.Fatalf("guard stops %d (stopped %v), trips %v, distrusted %v", st.GuardStops, got, st.Trips, st.Queues[0].Distrusted)
			}
			// A stopped request holds until it is released: its blocks are
			// the backend's until it notices.
			if st.GPUs[0].Stopping == 0 {
				t.Fatalf("nothing counted as stopping: %+v", st.GPUs[0])
			}
			for _, tk := range tks {
				tk.Release()
			}
			f.state(0, 0)
		})
	}
}

// A request that cannot be forecast — it does not report progress, or it
// sets its own length — commits its worst case (a pinned one grows to it
// for certain: see TestPinnedGrowthIsCertain), so its growth is never a
// guess the guard must correct, and a pinned length teaches nothing.
func TestPinnedAndOpaqueHeldAtWorstCase(t *testing.T) {
	for _, tc := range []struct {
		name      string
		edit      func(*admission.Request)
		now       int64 // what the guard counts it at: its progress when it reports it
		teachesTo float64
	}{
		{"min_tokens or ignore_eos", func(r *admission.Request) { r.Pinned = true }, 3 * 16, 100},
		{"non-streamed", func(r *admission.Request) { r.Opaque = true }, 65 * 16, 101},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := guarded(t, 1<<20, nil)
			r := chat(16, 1024)
			tc.edit(&r)
			tk := f.acquire(r)
			if ps := f.b.Scheduler.Stats().GPUs[0]; ps.Committed != 65*16 || ps.Now != tc.now {
				t.Fatalf("committed %d, now %d; want the worst case %d, now %d", ps.Committed, ps.Now, 65*16, tc.now)
			}
			tk.Done(0, 1024, true)
			if got := f.b.Scheduler.Stats().Queues[0].Samples; got != tc.teachesTo {
				t.Fatalf("samples %v after it finished, want %v", got, tc.teachesTo)
			}
			f.state(0, 0)
		})
	}
}

// A request given up before its sequence finished (an abort, a failure, a
// stop) teaches that it ran at least as long as it got: a censored sample.
func TestReleasedEarlyTeachesACensoredSample(t *testing.T) {
	f := newFixture(t, predicted(1<<20, 1000))
	tk := f.acquire(chat(16, 4096))
	tk.Progress(0, 700)
	tk.Release()
	q := f.b.Scheduler.Stats().Queues[0]
	if q.Samples != 1 {
		t.Fatalf("samples %v, want the censored one", q.Samples)
	}
	if q.MedianLength != 0 {
		t.Fatalf("median %d from a sample that only says L >= 700; want unknown (0)", q.MedianLength)
	}
	// One that never started teaches nothing.
	f.acquire(chat(16, 4096)).Release()
	if got := f.b.Scheduler.Stats().Queues[0].Samples; got != 1 {
		t.Fatalf("samples %v after a request released before any token", got)
	}
}

// A backend's overflow (an out-of-memory answer, preemptions) distrusts
// the forecast of every queue it serves.
func TestOverflowedDistrusts(t *testing.T) {
	f := guarded(t, 1<<20, nil)
	f.b.Scheduler.Overflowed(gpu)
	f.b.Scheduler.Overflowed("unknown") // ignored
	st := f.b.Scheduler.Stats()
	if st.Trips[admission.TripOverflow] != 1 || !st.Queues[0].Distrusted || st.Queues[0].Samples != 0 {
		t.Fatalf("after an overflow: trips %v, queue %+v", st.Trips, st.Queues[0])
	}
	f.acquire(chat(16, 1024))
	if ps := f.b.Scheduler.Stats().GPUs[0]; ps.Committed != 65*16 {
		t.Fatalf("committed %d, want the worst case", ps.Committed)
	}
}

// Exposure is bounded before anything is learned: a GPU's worst cases sum
// to at most MaxOvercommit × its capacity, a tenant's to that times its
// share.
func TestGuardExposure(t *testing.T) {
	for _, tc := range []struct {
		tenant string
		want   int
	}{
		{"", 6},  // 3 × 132 blocks hold six 65-block worst cases
		{"a", 3}, // half of it
	} {
		f := guarded(t, 132*16, func(c *admission.Config) { c.Policy.MaxOvercommit = 3 })
		r := chat(16, 1024)
		r.Tenant = tc.tenant
		if got := len(f.fillAtOnce(r)); got != tc.want {
			t.Errorf("tenant %q: admitted %d, want %d", tc.tenant, got, tc.want)
		}
	}
}

// A given-up request keeps what it holds until the backend can have let
// its blocks go; then the room goes to the next.
func TestLingerHoldsUntilTheBackendLetsGo(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{}))
	tk := f.acquire(std(80))
	w := f.enqueue(context.Background(), std(50))
	tk.Linger(time.Second)
	tk.Linger(time.Second) // once only
	f.state(80, 1)
	f.stillQueued(w)
	f.clock.Advance(time.Second - time.Nanosecond)
	f.state(80, 1)
	f.clock.Advance(time.Nanosecond)
	f.admitted(w).Release()
	f.state(0, 0)
	tk.Release() // already given back: nothing
	f.state(0, 0)
}

// resumableStopper is a stopper whose request can be resumed.
type resumableStopper struct{ stopper }

func (resumableStopper) Resumable() bool { return true }

var _ admission.ResumableStopper = resumableStopper{}

// The guard stops what can be resumed before anything that cannot, whatever
// its age, class or tenant: a resumed stream's client sees a pause, any
// other's an error. A request that says it cannot be resumed is not taken
// for one whatever its Stopper says.
func TestGuardStopsResumableFirst(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resumable []bool // in admission order; the last is the newest
		noResume  []bool
		want      string
	}{
		{"the oldest resumable before the newest", []bool{true, false, false, false}, nil, "r0"},
		{"a sheddable one's class counts only among the resumable", []bool{false, true, false, true}, nil, "r3"},
		{"NoResume outranks a resumable stopper", []bool{false, false, true, true}, []bool{false, false, false, true}, "r2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := guarded(t, 160*16, nil)
			log := &stops{}
			var tks []*admission.Ticket
			for i, res := range tc.resumable {
				rq := chat(16, 1024)
				name := "r" + string(rune('0'+i))
				rq.Stopper = stopper{name, log}
				if res {
					rq.Stopper = resumableStopper{stopper{name, log}}
				}
				rq.NoResume = i < len(tc.noResume) && tc.noResume[i]
				tks = append(tks, f.acquire(rq))
			}
			for gen := 16; len(log.names()) == 0 && gen <= 1024; gen += 16 {
				for _, tk := range tks {
					tk.Progress(0, gen)
				}
			}
			if got := log.names(); len(got) == 0 || got[0] != tc.want {
				t.Fatalf("stopped %v, want %s first", got, tc.want)
			}
			for _, tk := range tks {
				tk.Release()
			}
			f.state(0, 0)
		})
	}
}

// A request that cannot be resumed, admitted while its queue warms up, is
// held at its worst case after the warm-up ends, where one that can be is
// forecast from then on: a short forecast would have the guard fail it.
func TestNoResumeKeepsItsWorstCaseAfterTheWarmUp(t *testing.T) {
	const warmup = 20
	for _, tc := range []struct {
		name     string
		noResume bool
		want     func(charge int64) bool
	}{
		{"resumable: forecast", false, func(c int64) bool { return c < 65*16 }},
		{"no resume: worst case", true, func(c int64) bool { return c == 65*16 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, predicted(1<<30, warmup))
			rq := chat(16, 1024)
			rq.NoResume = tc.noResume
			tk := f.acquire(rq)
			tk.Progress(0, 16)
			if c := f.b.Stats().GPUs[0].Charge; c != 65*16 {
				t.Fatalf("during the warm-up it counts %d, want its worst case %d", c, 65*16)
			}
			f.teach(warmup, 50)
			tk.Progress(0, 32) // the next report moves it onto the forecast, or not
			if c := f.b.Stats().GPUs[0].Charge; !tc.want(c) {
				t.Fatalf("after the warm-up it counts %d (worst case %d)", c, 65*16)
			}
			tk.Release()
			f.state(0, 0)
		})
	}
}

// The worst cases of the requests that cannot be resumed, with those of
// the requests that cannot be stopped, never sum past the GPU: whatever
// they grow to, stopping the resumable streams makes room, so the guard
// never has to fail one. Resumable ones are admitted on their forecast
// beside them as before.
func TestNoResumeWorstCasesFitTheGPU(t *testing.T) {
	f := guarded(t, 160*16, nil) // each request's worst case is 65 blocks: two fit
	log := &stops{}
	fixed := func(name string) admission.Request {
		r := chat(16, 1024)
		r.Stopper, r.NoResume = stopper{name, log}, true
		return r
	}
	a, b := f.acquire(fixed("a")), f.acquire(fixed("b"))
	third := f.enqueue(context.Background(), fixed("c"))
	// Resumable streams still come in on their forecast (20 tokens).
	var res []*admission.Ticket
	for i := range 4 {
		r := chat(16, 1024)
		r.Stopper = resumableStopper{stopper{"r" + string(rune('0'+i)), log}}
		res = append(res, f.acquire(r))
	}
	f.stillQueued(third)
	// Everything runs long: only resumable streams are stopped.
	for gen := 16; gen <= 1024; gen += 16 {
		for _, tk := range append([]*admission.Ticket{a, b}, res...) {
			tk.Progress(0, gen)
		}
	}
	for _, name := range log.names() {
		if name == "a" || name == "b" {
			t.Fatalf("stopped %v: a request that cannot be resumed among them", log.names())
		}
	}
	if len(log.names()) == 0 {
		t.Fatal("nothing stopped: the test proves nothing")
	}
	for _, tk := range append([]*admission.Ticket{a}, res...) {
		tk.Release()
	}
	c := f.admitted(third)
	b.Release()
	c.Release()
	f.state(0, 0)
}

// flagStopper records that the guard stopped its request.
type flagStopper struct{ stopped *bool }

func (s flagStopper) StopForMemory() { *s.stopped = true }

// The guard counts each sequence with its next block (its lead), so that a
// stop has a block's worth of steps to take effect: requests admitted on a
// forecast of 20-token outputs all run long, token by token, in lockstep
// (every sequence enters a new block at the same step, the worst case for
// the guard's margin), and each stopped one goes on generating, its blocks
// still the engine's, until its abort takes effect 16 steps later — the
// gateway holds it meanwhile (Linger). What the engine really holds never
// passes the GPU, whatever the prompts' phase against the blocks. (With
// a lead of 8 tokens instead, it passed it once an abort took 10 steps.)
func TestGuardStopsTakeEffectBeforeTheGPUIsExceeded(t *testing.T) {
	const (
		capacity = 400 // blocks of 16 tokens, 16 bytes each
		step     = 10 * time.Millisecond
		abort    = 16 // steps from a stop to the engine letting its blocks go
	)
	for _, prompt := range []int{16, 21, 27, 31} {
		f := guarded(t, capacity*16, nil)
		type seq struct {
			tk      *admission.Ticket
			g       int
			stopped bool
			left    int // steps until its abort takes effect, once stopped
		}
		var run []*seq
		for {
			s := &seq{}
			r := chat(prompt, 512)
			r.Deadline, r.Stopper = t0, flagStopper{&s.stopped}
			tk, err := f.b.Acquire(context.Background(), r)
			if err != nil {
				break
			}
			s.tk = tk
			run = append(run, s)
		}
		stops := 0
		for i := 0; len(run) > 0; i++ {
			left := run[:0]
			for _, s := range run {
				s.g++ // the engine generates, stopped or not, until its abort
				switch {
				case s.stopped && s.left == 0:
					stops++
					s.left = abort
					s.tk.Linger(abort * step)
				case s.stopped:
					if s.left--; s.left == 0 {
						continue // aborted: the engine let its blocks go
					}
				case s.g >= 512:
					s.tk.Done(0, s.g, true)
					continue
				default:
					s.tk.Progress(0, s.g)
				}
				left = append(left, s)
			}
			run = left
			held := 0
			for _, s := range run {
				held += (prompt + s.g + 1 + 15) / 16 // the token being computed has its slot
			}
			if held > capacity {
				t.Fatalf("prompt %d, step %d: %d sequences hold %d blocks of %d (%d stopped so far)", prompt, i, len(run), held, capacity, stops)
			}
			f.clock.Advance(step)
		}
		if stops == 0 {
			t.Fatalf("prompt %d: the guard stopped nothing", prompt)
		}
		f.clock.Advance(abort * step)
		f.state(0, 0)
	}
}
