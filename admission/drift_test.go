package admission_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// flow is a set of closed-loop clients of one tenant and class: each sends
// a request (a 64-token prompt, outputs up to maxTokens) as soon as its last
// one finished, from step from until step until (0: to the end).
type flow struct {
	tenant, class string
	clients       int
	maxTokens     int
	length        func(r *rand.Rand, step int) int // natural output length of a request sent at step
	from, until   int
	// resumable: its streams can be stopped and resumed (admitted on
	// ResumableEpsilon, and a guard stop of them distrusts nothing).
	resumable bool
}

// resumably is flows with every stream resumable.
func resumably(flows []flow) []flow {
	out := make([]flow, len(flows))
	for i, fl := range flows {
		fl.resumable = true
		out[i] = fl
	}
	return out
}

// lognormal is a length drawn around median with log-spread sigma.
func lognormal(median, sigma float64) func(*rand.Rand, int) int {
	return func(r *rand.Rand, _ int) int { return max(1, int(median*math.Exp(sigma*r.NormFloat64()))) }
}

// flowRun is what driving flows saw.
type flowRun struct {
	tripAt   int // first step at which a drift trip was counted; -1: none
	finished int // requests that ran to their end
	peak     int64
}

// drive runs flows on f for steps steps of 16 tokens each, 100 ms of the
// manual clock apart: each running request reports the block it entered
// and finishes at its length (or its cap); each idle client then sends
// again, refused at once when it does not fit (it tries again next step).
// At every step what the running requests may hold is checked against the
// capacity: the guard's promise.
func drive(f *fixture, steps int, flows ...flow) flowRun {
	f.t.Helper()
	type client struct {
		fl     *flow
		tk     *admission.Ticket
		gen    int
		length int
		capped bool
		r      *rand.Rand
		stop   *stopFlag
	}
	var clients []*client
	for i := range flows {
		for c := range flows[i].clients {
			clients = append(clients, &client{fl: &flows[i], r: rand.New(rand.NewPCG(uint64(i), uint64(c)))})
		}
	}
	run := flowRun{tripAt: -1}
	for step := range steps {
		for _, c := range clients {
			if c.tk == nil {
				continue
			}
			if c.stop.set { // the guard stopped it: the stream ends, its blocks go back
				c.tk.Release()
				c.tk = nil
				continue
			}
			c.gen = min(c.gen+16, c.length)
			if c.gen >= c.length {
				c.tk.Done(0, c.length, c.capped)
				c.tk.Release()
				c.tk = nil
				run.finished++
				continue
			}
			c.tk.Progress(0, c.gen)
		}
		// Clients send in a turning order, so that no flow is always
		// first to the room that frees. Once a flow's request is refused,
		// the rest of its idle clients would be too (the same request, and
		// nothing gives room back before the next step): they try again
		// next step.
		refused := map[*flow]bool{}
		for i := range clients {
			c := clients[(i+step*7)%len(clients)]
			fl := c.fl
			if c.tk != nil || refused[fl] || step < fl.from || (fl.until > 0 && step >= fl.until) {
				continue
			}
			r := chat(64, fl.maxTokens)
			stop := &stopFlag{}
			r.Tenant, r.Class, r.Deadline, r.Stopper = fl.tenant, fl.class, f.clock.Now(), stop
			if fl.resumable {
				r.Stopper = resumableFlag{stop}
			}
			tk, err := f.b.Acquire(context.Background(), r)
			if err != nil {
				refused[fl] = true
				continue
			}
			n := fl.length(c.r, step)
			c.tk, c.gen, c.stop = tk, 0, stop
			c.length, c.capped = min(n, fl.maxTokens), n >= fl.maxTokens
		}
		st := f.b.Scheduler.Stats()
		if ps := st.GPUs[0]; ps.Now-ps.Stopping > ps.Capacity {
			f.t.Fatalf("step %d: what runs may hold %d of a capacity of %d", step, ps.Now-ps.Stopping, ps.Capacity)
		}
		run.peak = max(run.peak, st.GPUs[0].Now)
		if run.tripAt < 0 && st.Trips[admission.TripDrift] > 0 {
			run.tripAt = step
		}
		f.clock.Advance(100 * time.Millisecond)
	}
	for _, c := range clients {
		if c.tk != nil {
			c.tk.Release()
		}
	}
	return run
}

// stopFlag is a Stopper the driver looks at at its next step (it is
// called after the scheduler's lock is released, on the goroutine of the
// Progress that found the GPU over its line: the driver's own).
type stopFlag struct{ set bool }

func (s *stopFlag) StopForMemory() { s.set = true }

// resumableFlag is a stopFlag whose stream could be resumed (the driver
// ends it all the same).
type resumableFlag struct{ *stopFlag }

func (resumableFlag) Resumable() bool { return true }

// contended is a predicted scheduler on a GPU of 750 blocks of 16 bytes:
// the flows below send several times what it holds.
func contended(t *testing.T) *fixture {
	cfg := predicted(750*16, 100)
	cfg.Tenants = []admission.TenantConfig{{Name: "batch"}, {Name: "chat"}, {Name: "new"}}
	return newFixture(t, cfg)
}

// The change detector trips on danger, not on change: tenants joining or
// leaving, classes changing their mix and outputs turning shorter are
// ordinary events of a shared gateway, and none trips it, however much
// more than the GPU holds is sent.
//
// Each case drives a thousand steps of a hundred clients with every
// invariant checked after every operation: the cases run in parallel, with
// each other and with the test below.
func TestDriftIgnoresChangeThatIsNoDanger(t *testing.T) {
	t.Parallel()
	batch := flow{tenant: "batch", class: "standard", clients: 56, maxTokens: 1024, length: lognormal(200, 1)}
	for _, tc := range []struct {
		name  string
		flows []flow
	}{
		{"steady traffic", []flow{batch}},
		{"the two-tenant mix: an interactive tenant joins after a warm-up of batch traffic alone", []flow{batch,
			{tenant: "chat", class: "critical", clients: 8, maxTokens: 256, length: lognormal(200, 1), from: 300}}},
		{"a tenant with shorter outputs joins", []flow{batch,
			{tenant: "new", clients: 32, maxTokens: 1024, length: lognormal(30, 0.5), from: 300}}},
		{"a tenant leaves", []flow{
			{tenant: "batch", clients: 32, maxTokens: 1024, length: lognormal(200, 1), until: 600},
			{tenant: "chat", clients: 32, maxTokens: 1024, length: lognormal(60, 0.8)}}},
		{"classes change their mix", []flow{
			// One anonymous tenant, two classes: the short class joins,
			// then the long class grows from half of the clients to
			// seven eighths.
			{class: "standard", clients: 32, maxTokens: 1024, length: lognormal(300, 0.8)},
			{class: "critical", clients: 8, maxTokens: 1024, length: lognormal(40, 0.8), from: 200},
			{class: "critical", clients: 24, maxTokens: 1024, length: lognormal(40, 0.8), from: 200, until: 500},
			{class: "standard", clients: 24, maxTokens: 1024, length: lognormal(300, 0.8), from: 500}}},
		{"outputs turn shorter", []flow{
			{clients: 64, maxTokens: 1024, length: func(r *rand.Rand, step int) int {
				if step < 400 {
					return lognormal(300, 0.8)(r, step)
				}
				return lognormal(20, 0.5)(r, step)
			}}}},
	} {
		// Streams that cannot be resumed, then ones that can: admitted on
		// the looser bound, the guard may pause some, which distrusts
		// nothing.
		for _, resumable := range []bool{false, true} {
			name, flows := tc.name, tc.flows
			if resumable {
				name, flows = name+", resumable", resumably(flows)
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f := contended(t)
				run := drive(f, 1000, flows...)
				st := f.b.Scheduler.Stats()
				t.Logf("finished %d, peak now %d of %d, trips %v by scope %v, guard stops %d",
					run.finished, run.peak, st.GPUs[0].Capacity, st.Trips, st.DriftTrips, st.GuardStops)
				if st.Trips[admission.TripDrift] != 0 || st.Trips[admission.TripGuard] != 0 || st.Queues[0].Distrusted {
					t.Fatalf("tripped (first at step %d): trips %v by scope %v", run.tripAt, st.Trips, st.DriftTrips)
				}
				if !st.Queues[0].Predicting {
					t.Fatalf("not predicting at the end: %+v", st.Queues[0])
				}
				f.state(0, 0)
			})
		}
	}
}

// A real shift to long outputs trips within seconds of the first long
// answers outgrowing their forecast, with no overflow meanwhile (drive
// checks it at every step): the whole queue's for its anonymous traffic,
// only the tenant's when one named tenant turns long — the other keeps its
// forecast.
func TestDriftTripsOnAShiftToLongOutputs(t *testing.T) {
	t.Parallel()
	long := func(median float64, at int) func(*rand.Rand, int) int {
		return func(r *rand.Rand, step int) int {
			if step < at {
				return lognormal(median, 0.8)(r, step)
			}
			return 1000 + r.IntN(1000)
		}
	}
	const shift = 400
	// Streams that can be resumed too: the guard's stops of them distrust
	// nothing, and the detector is what trips, as soon.
	for _, resumable := range []bool{false, true} {
		name := "every request"
		if resumable {
			name += ", resumable"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := contended(t)
			run := drive(f, 800, flow{clients: 64, maxTokens: 2048, length: long(50, shift), resumable: resumable})
			st := f.b.Scheduler.Stats()
			t.Logf("tripped at step %d (%v after the shift), trips %v by scope %v, guard stops %d",
				run.tripAt, time.Duration(run.tripAt-shift)*100*time.Millisecond, st.Trips, st.DriftTrips, st.GuardStops)
			// The long answers pass the old forecast's 0.9 quantile (about 140
			// tokens) within 9 steps; the trip follows within seconds.
			if run.tripAt < shift || run.tripAt > shift+50 || st.DriftTrips[admission.DriftQueue] != 1 {
				t.Fatalf("tripped at step %d (shift at %d): trips %v by scope %v", run.tripAt, shift, st.Trips, st.DriftTrips)
			}
		})
	}
	t.Run("one tenant", func(t *testing.T) {
		t.Parallel()
		// Tenant batch turns to 300-400 tokens, which the GPU can hold
		// (48 × 29 blocks) once its requests are held at their worst case:
		// the guard need not act, and only that tenant is distrusted.
		f := newFixture(t, func() admission.Config {
			cfg := predicted(1500*16, 100)
			cfg.Tenants = []admission.TenantConfig{{Name: "batch"}, {Name: "chat"}}
			return cfg
		}())
		var probe *admission.Ticket
		run := drive(f, 600,
			flow{tenant: "batch", clients: 48, maxTokens: 512, length: func(r *rand.Rand, step int) int {
				if step < shift {
					return lognormal(50, 0.8)(r, step)
				}
				return 300 + r.IntN(100)
			}},
			flow{tenant: "chat", clients: 16, maxTokens: 512, length: lognormal(50, 0.8)})
		st := f.b.Scheduler.Stats()
		t.Logf("tripped at step %d, trips %v by scope %v, guard stops %d", run.tripAt, st.Trips, st.DriftTrips, st.GuardStops)
		if run.tripAt < shift || run.tripAt > shift+50 || st.DriftTrips[admission.DriftTenant] != 1 || st.DriftTrips[admission.DriftQueue] != 0 || st.GuardStops != 0 {
			t.Fatalf("tripped at step %d (shift at %d): trips %v by scope %v, guard stops %d", run.tripAt, shift, st.Trips, st.DriftTrips, st.GuardStops)
		}
		if st.Queues[0].Distrusted {
			t.Fatalf("the queue is distrusted: only the tenant that turned long should be")
		}
		// The tenant that stayed short is still forecast (a 64-token prompt
		// and a 512-token cap are 36 blocks at worst), the one that turned
		// long is not.
		r := chat(64, 512)
		r.Tenant = "chat"
		probe = f.acquire(r)
		if c := f.b.Scheduler.Stats().GPUs[0].Committed; c >= 36*16 {
			t.Fatalf("tenant chat committed %d: held at its worst case", c)
		}
		probe.Release()
		r.Tenant = "batch"
		probe = f.acquire(r)
		if c := f.b.Scheduler.Stats().GPUs[0].Committed; c != 36*16 {
			t.Fatalf("tenant batch committed %d, want its worst case %d", c, 36*16)
		}
		probe.Release()
		// After the cool-down the tenant learns its new lengths over, and
		// is forecast from them once it has warmup_samples of them.
		f.clock.Advance(admission.DefaultCoolDown)
		f.teachAs("batch", 100, 350)
		probe = f.acquire(r)
		if c := f.b.Scheduler.Stats().GPUs[0].Committed; c >= 36*16 || c < (4+350/16)*16 {
			t.Fatalf("tenant batch committed %d after its cool-down and 100 answers of 350 tokens", c)
		}
		probe.Release()
	})
}

// Lengths a restart starts from (LengthsState, merged into a new
// scheduler, as the gateway's lengths file or the fleet's stream gives
// them) are a forecast like any other: traffic that turned long while the
// gateway was down trips the change detector, as a shift in service does.
func TestDriftTripsOnRestoredLengths(t *testing.T) {
	before := contended(t)
	drive(before, 400, flow{clients: 64, maxTokens: 2048, length: lognormal(50, 0.8)})
	state, ok, err := before.b.Scheduler.LengthsState("")
	if err != nil || !ok {
		t.Fatalf("LengthsState: %v, %v", ok, err)
	}
	f := contended(t)
	if err := f.b.Scheduler.MergeLengths("", state); err != nil {
		t.Fatal(err)
	}
	if q := f.b.Scheduler.Stats().Queues[0]; q.Samples < 100 {
		t.Fatalf("restored %v samples, want the warm-up's 100 at least", q.Samples)
	}
	run := drive(f, 200, flow{clients: 64, maxTokens: 2048, length: func(r *rand.Rand, _ int) int { return 1000 + r.IntN(1000) }})
	st := f.b.Scheduler.Stats()
	t.Logf("tripped at step %d, trips %v by scope %v, guard stops %d", run.tripAt, st.Trips, st.DriftTrips, st.GuardStops)
	if run.tripAt < 0 || run.tripAt > 50 || st.DriftTrips[admission.DriftQueue] != 1 {
		t.Fatalf("tripped at step %d: trips %v by scope %v", run.tripAt, st.Trips, st.DriftTrips)
	}
}
