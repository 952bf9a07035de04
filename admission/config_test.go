package admission_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
)

func TestConfigValidationNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  admission.Config
		want string
	}{
		{"no GPUs", admission.Config{}, "GPUs: at least one GPU is required"},
		{"zero capacity", oneGPU(0, admission.Config{}), "GPUs[0].capacity: 0 must be > 0"},
		{"negative capacity", oneGPU(-5, admission.Config{}), "GPUs[0].capacity: -5"},
		{"GPU name", admission.Config{GPUs: []admission.GPUConfig{{Capacity: 1}}}, "GPUs[0].name: must not be empty"},
		{"duplicate GPU", admission.Config{GPUs: []admission.GPUConfig{{Name: "a", Capacity: 1}, {Name: "a", Capacity: 1}}}, `GPUs[1].name: "a" already names GPUs[0]`},
		{"no queues", admission.Config{GPUs: []admission.GPUConfig{{Name: "a", Capacity: 1}}}, "queues: at least one queue is required"},
		{"queue without GPUs", admission.Config{GPUs: []admission.GPUConfig{{Name: "a", Capacity: 1}}, Queues: []admission.QueueConfig{{Name: "m"}}}, "queues[0].GPUs: at least one GPU is required"},
		{"queue's unknown GPU", admission.Config{GPUs: []admission.GPUConfig{{Name: "a", Capacity: 1}}, Queues: []admission.QueueConfig{{Name: "m", GPUs: []string{"a", "b"}}}}, `queues[0].GPUs[1]: "b" is not one of the GPUs`},
		{"duplicate queue", admission.Config{GPUs: []admission.GPUConfig{{Name: "a", Capacity: 1}}, Queues: []admission.QueueConfig{{Name: "m", GPUs: []string{"a"}}, {Name: "m", GPUs: []string{"a"}}}}, `queues[1].name: "m" already names queues[0]`},
		{"reservation", oneGPU(1, admission.Config{Policy: admission.PolicyConfig{Reservation: "optimistic"}}), `policy.reservation: "optimistic" is not worst_case or predicted`},
		{"epsilon", oneGPU(1, admission.Config{Policy: admission.PolicyConfig{Epsilon: 0.5}}), "policy.epsilon: 0.5 is not in (0, 0.5)"},
		{"headroom", oneGPU(1, admission.Config{Policy: admission.PolicyConfig{Headroom: 0.7}}), "policy.headroom: 0.7 is not in [0, 0.5)"},
		{"empty class name", oneGPU(1, admission.Config{Classes: []admission.ClassConfig{{Name: "a"}, {}}}), "classes[1].name: must not be empty"},
		{"duplicate class", oneGPU(1, admission.Config{Classes: []admission.ClassConfig{{Name: "a"}, {Name: "a"}}}), `classes[1].name: "a" already names classes[0]`},
		{"default class", oneGPU(1, admission.Config{DefaultClass: "gold"}), `default_class: "gold" is not one of the classes`},
		{"empty tenant", oneGPU(1, admission.Config{Tenants: []admission.TenantConfig{{}}}), "tenants[0].name: must not be empty"},
		{"duplicate tenant", oneGPU(1, admission.Config{Tenants: []admission.TenantConfig{{Name: "x"}, {Name: "x"}}}), `tenants[1].name: tenant "x" is listed twice`},
		{"share", oneGPU(1, admission.Config{Tenants: []admission.TenantConfig{{Name: "x", Share: 1.5}}}), "tenants[0].share: 1.5 is not in (0,1]"},
		{"queue share", oneGPU(1, admission.Config{Tenants: []admission.TenantConfig{{Name: "x", QueueShare: -0.1}}}), "tenants[0].queue_share"},
		{"nan share", oneGPU(1, admission.Config{Tenants: []admission.TenantConfig{{Name: "x", Share: math.NaN()}}}), "tenants[0].share: NaN"},
		{"default share", oneGPU(1, admission.Config{DefaultTenantShare: 2}), "default_tenant_share: 2 is not in (0,1]"},
		{"pressure", oneGPU(1, admission.Config{PressureThreshold: -1}), "pressure_threshold"},
		{"drain window", oneGPU(1, admission.Config{DrainWindow: -time.Second}), "drain_window"},
		{"tiny drain window", oneGPU(1, admission.Config{DrainWindow: time.Millisecond}), "drain_window: 1ms must be >= 10ms"},
		{"max retry", oneGPU(1, admission.Config{MaxRetryAfter: time.Millisecond}), "max_retry_after: 1ms must be >= 1s"},
		{"aimd decrease 1", oneGPU(1, admission.Config{AIMD: admission.AIMDConfig{Decrease: 1}}), "aimd.decrease: 1 is not in (0,1)"},
		{"aimd increase", oneGPU(1, admission.Config{AIMD: admission.AIMDConfig{Increase: 2}}), "aimd.increase"},
		{"aimd floor", oneGPU(1, admission.Config{AIMD: admission.AIMDConfig{MinFraction: -1}}), "aimd.min_fraction"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := admission.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, %v; want an error containing %q", b, err, tc.want)
			}
		})
	}
	// Every problem is reported at once.
	_, err := admission.New(admission.Config{Classes: []admission.ClassConfig{{}}, PressureThreshold: 3})
	for _, want := range []string{"GPUs", "classes[0].name", "pressure_threshold"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("joined error %v lacks %q", err, want)
		}
	}
}

func TestDefaultClasses(t *testing.T) {
	d := admission.DefaultClasses()
	if len(d) != 3 || d[0].Name != "critical" || d[1].Name != "standard" || d[2].Name != "sheddable" ||
		d[0].IsSheddable() || d[1].IsSheddable() || !d[2].IsSheddable() {
		t.Fatalf("DefaultClasses = %+v", d)
	}
	f := newFixture(t, oneGPU(10, admission.Config{}))
	s := f.b.Stats()
	if len(s.Classes) != 3 || s.Classes[2].Name != "sheddable" {
		t.Fatalf("empty Classes did not mean DefaultClasses: %+v", s.Classes)
	}
}

func TestReconfigure(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{PressureThreshold: 1,
		Tenants: []admission.TenantConfig{{Name: "a", Share: 1}}}))
	shedTk := f.acquire(req("sheddable", "", 2))
	hold := f.acquire(req("standard", "", 8))
	shedW := f.enqueue(context.Background(), req("sheddable", "", 1))
	stdW := f.enqueue(context.Background(), req("standard", "", 1))
	aW := f.enqueue(context.Background(), req("standard", "a", 6))
	err := f.b.Reconfigure(oneGPU(20, admission.Config{PressureThreshold: 1,
		Classes: []admission.ClassConfig{{Name: "standard"}, {Name: "batch"}},
		Tenants: []admission.TenantConfig{{Name: "a", Share: 0.25}}}))
	if err != nil {
		t.Fatal(err)
	}
	// The removed class's waiter is refused, not lost; a's waiter no longer
	// fits a's cap (0.25 × 20 = 5); the standard one fits the new capacity.
	if re := f.refused(shedW, admission.ErrQueueFull); re.Class != "sheddable" {
		t.Fatalf("removed class waiter: %+v", re)
	}
	f.refused(aW, admission.ErrTenantQuota)
	tw := f.admitted(stdW)
	f.capacity(20, 20)
	// Held tickets stay valid, including the one of the removed class.
	f.state(11, 0)
	shedTk.Release()
	hold.Release()
	tw.Release()
	f.state(0, 0)
	if _, err := f.b.Acquire(context.Background(), req("sheddable", "", 1)); err == nil {
		t.Fatal("the removed class still admits")
	}
	f.acquire(req("batch", "", 20)).Release()
	f.reject(req("batch", "a", 6), admission.ErrTenantQuota)
	s := f.b.Stats()
	if len(s.Classes) != 2 || s.Classes[1].Name != "batch" {
		t.Fatalf("classes after reload: %+v", s.Classes)
	}
}

func TestReconfigureInvalidKeepsTheOldConfig(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{Classes: []admission.ClassConfig{{Name: "only", ClassLimits: admission.ClassLimits{MaxQueued: 1}}}}))
	err := f.b.Reconfigure(oneGPU(0, admission.Config{Classes: []admission.ClassConfig{{Name: "x"}, {Name: "x"}}}))
	if err == nil || !strings.Contains(err.Error(), "capacity") || !strings.Contains(err.Error(), "classes[1].name") {
		t.Fatalf("Reconfigure(bad) = %v", err)
	}
	f.capacity(10, 10)
	hold := f.acquire(req("only", "", 10))
	w := f.enqueue(context.Background(), req("only", "", 1))
	f.reject(req("only", "", 1), admission.ErrQueueFull) // MaxQueued 1 still in force
	hold.Release()
	f.admitted(w).Release()
}

func TestReconfigureReordersPriorities(t *testing.T) {
	classes := []admission.ClassConfig{{Name: "x"}, {Name: "y"}}
	f := newFixture(t, oneGPU(10, admission.Config{Classes: classes}))
	hold := f.acquire(admission.Request{Class: "x", Shape: chunks(2, 5).Shape})
	x := f.enqueue(context.Background(), req("x", "", 5))
	y := f.enqueue(context.Background(), req("y", "", 5))
	if err := f.b.Reconfigure(oneGPU(10, admission.Config{Classes: []admission.ClassConfig{{Name: "y"}, {Name: "x"}}})); err != nil {
		t.Fatal(err)
	}
	done(hold, 1)
	ty := f.admitted(y) // y is now the higher class
	f.state(10, 1)
	hold.Release()
	f.admitted(x).Release()
	ty.Release()
}

func TestReconfigureKeepsDeadlinesAndTheDrainMeasurement(t *testing.T) {
	f := measured(t, admission.Config{})
	ch := f.enqueue(context.Background(), admission.Request{Weight: 80, Deadline: t0.Add(5 * time.Second)})
	if err := f.b.Reconfigure(oneGPU(100, admission.Config{})); err != nil {
		t.Fatal(err)
	}
	if r := f.b.Stats().DrainRate; r != 25 {
		t.Fatalf("drain rate after an unchanged window: %v", r)
	}
	f.clock.Advance(3 * time.Second)
	f.refused(ch, admission.ErrQueueTimeout)
	if err := f.b.Reconfigure(oneGPU(100, admission.Config{DrainWindow: 20 * time.Second})); err != nil {
		t.Fatal(err)
	}
	if r := f.b.Stats().DrainRate; r != 0 {
		t.Fatalf("a new drain window must start cold, rate %v", r)
	}
}

func TestReconfigureDefaultShareAppliesToUnlistedTenants(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{Tenants: []admission.TenantConfig{{Name: "a", Share: 0.2}}}))
	tk := f.acquire(req("", "a", 2))
	if err := f.b.Reconfigure(oneGPU(10, admission.Config{DefaultTenantShare: 0.3})); err != nil {
		t.Fatal(err)
	}
	// a is no longer listed: it takes the default share, 3.
	f.acquire(req("", "a", 1)).Release()
	f.reject(req("", "a", 4), admission.ErrTenantQuota)
	f.reject(req("", "b", 4), admission.ErrTenantQuota)
	tk.Release()
	for _, ts := range f.b.Stats().Tenants {
		if ts.Name == "a" {
			t.Fatalf("an unlisted idle tenant is still tracked: %+v", ts)
		}
	}
}

// Issue 26, R4: a GPU removed by one Reconfigure and configured again by
// the next is the same GPU while tickets still run on it: its GPU holds
// them, so it must not count from zero and admit them a second time. Once
// they have ended it starts afresh; a limit it had (a lease given back on
// removal) is not trusted again.
func TestReconfigureReaddedGPUKeepsItsTickets(t *testing.T) {
	two := func(c admission.Config) admission.Config {
		return fleet([]admission.GPUConfig{{Name: "a", Capacity: 100}, {Name: "b", Capacity: 100}},
			map[string][]string{"onlyA": {"a"}, "onlyB": {"b"}}, c)
	}
	one := func(c admission.Config) admission.Config {
		return fleet([]admission.GPUConfig{{Name: "a", Capacity: 100}}, map[string][]string{"onlyA": {"a"}}, c)
	}
	for _, tc := range []struct {
		name           string
		limited        bool
		releaseBetween bool // the ticket ends while b is not configured
		wantHeld       string
	}{
		{"re-added while its ticket runs", false, false, "a=0 b=60"},
		{"re-added after its ticket ended", false, true, "a=0 b=0"},
		{"limited: re-added closed", true, false, "a=0 b=60"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, two(admission.Config{Limited: tc.limited}))
			if tc.limited {
				f.setLimit("a", 100)
				f.setLimit("b", 100)
			}
			tk := f.acquire(in("onlyB", 60))
			if err := f.b.Reconfigure(one(admission.Config{Limited: tc.limited})); err != nil {
				t.Fatal(err)
			}
			// Removed, b is still asked for what it runs: a lessee shutting
			// down must not give that back.
			f.demand("b", 60, 0)
			if tc.releaseBetween {
				tk.Release()
				f.demand("b", 0, 0)
			}
			if err := f.b.Reconfigure(two(admission.Config{Limited: tc.limited})); err != nil {
				t.Fatal(err)
			}
			if got := f.gpusHeld(); got != tc.wantHeld {
				t.Fatalf("held after re-adding b: %s, want %s", got, tc.wantHeld)
			}
			st, _ := f.b.GPU("b")
			if tc.limited && st.Limit != 0 {
				t.Errorf("re-added b has limit %d, want 0 until it is leased again", st.Limit)
			}
			if tc.limited {
				f.setLimit("b", 100)
			}
			if tc.releaseBetween {
				f.acquire(in("onlyB", 100)).Release()
				return
			}
			w := f.enqueue(context.Background(), in("onlyB", 60))
			f.stillQueued(w) // 60 + 60 > 100: the running ticket counts
			tk.Release()
			f.admitted(w).Release()
		})
	}
}
