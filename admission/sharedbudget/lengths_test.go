package sharedbudget

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
)

// replicaLengths is one replica's scheduler and lengths sharer, on a real
// Redis.
type replicaLengths struct {
	name  string
	sched *admission.Scheduler
	x     *lengthSharer
}

func newReplicaLengths(t *testing.T, srv *sharedbudgettest.Redis, name string, maxLen int) *replicaLengths {
	t.Helper()
	s, err := admission.New(admission.Config{
		GPUs:   []admission.GPUConfig{{Name: "gpu0", Capacity: 1 << 30}},
		Queues: []admission.QueueConfig{{Name: "m", GPUs: []string{"gpu0"}, MaxLen: maxLen}},
		Policy: admission.PolicyConfig{Reservation: admission.Predicted},
	})
	if err != nil {
		t.Fatal(err)
	}
	// MaxRetries -1: a stopped Redis fails the exchange at once instead
	// of after go-redis's reconnection backoff.
	c := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	return &replicaLengths{name: name, sched: s,
		x: newLengthSharer(c, s, "kvgate:", name, func() []string { return []string{"m"} }, nil, slog.New(slog.DiscardHandler), time.Now)}
}

// teach finishes n requests of tenant whose single sequence stopped on its
// own after length tokens.
func (r *replicaLengths) teach(t *testing.T, tenant string, n, length int) {
	t.Helper()
	for range n {
		tk, err := r.sched.Acquire(context.Background(), admission.Request{Queue: "m", Tenant: tenant,
			Shape: []admission.Group{{Cap: length + 1, Seqs: 1, BlockTokens: 16, BlockBytes: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		tk.Done(0, length, false)
	}
}

func (r *replicaLengths) samples() float64 { return r.sched.Stats().Queues[0].Samples }

func (r *replicaLengths) sync(t *testing.T) error {
	t.Helper()
	return r.x.sync(context.Background())
}

// Two replicas (and a third that starts late) share what they learn
// through one real redis-server: every sample counts once on every replica
// — never twice, never its own back — and survives a Redis restart.
func TestLengthsSharedThroughRedis(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	a, b := newReplicaLengths(t, srv, "a", 8192), newReplicaLengths(t, srv, "b", 8192)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	want := func(step string, wants map[*replicaLengths]float64) {
		t.Helper()
		for r, w := range wants {
			if got := r.samples(); got != w {
				t.Fatalf("%s: replica %s predicts from %v samples, want %v", step, r.name, got, w)
			}
		}
	}
	// The first exchange starts counting: what a replica learned before
	// it is its own.
	a.teach(t, "", 4, 100)
	must(a.sync(t))
	must(b.sync(t))
	want("before sharing", map[*replicaLengths]float64{a: 4, b: 0})

	a.teach(t, "t1", 10, 100)
	must(a.sync(t))
	must(a.sync(t)) // its own entry comes back from the stream: skipped
	must(b.sync(t))
	must(b.sync(t)) // read once only
	want("a's samples shared", map[*replicaLengths]float64{a: 14, b: 10})

	b.teach(t, "", 5, 300)
	a.teach(t, "", 2, 50)
	must(b.sync(t))
	must(a.sync(t))
	must(b.sync(t))
	want("both ways", map[*replicaLengths]float64{a: 21, b: 17})
	if d, ok, _ := b.sched.LengthsDelta("m"); ok {
		t.Fatalf("b's delta after the exchanges holds merged samples: %+v", d)
	}

	// Redis down: the samples wait, and go out once it is back (empty).
	a.teach(t, "", 3, 100)
	srv.Stop()
	if err := a.sync(t); err == nil {
		t.Fatal("an exchange with Redis stopped succeeded")
	}
	srv.Restart()
	must(a.sync(t))
	must(b.sync(t))
	want("after a Redis restart", map[*replicaLengths]float64{a: 24, b: 20})

	// A replica that starts late warms up from what the stream still has
	// (since the restart: a's 3), and a replica whose model has another
	// max_model_len merges nothing.
	c := newReplicaLengths(t, srv, "c", 8192)
	must(c.sync(t))
	want("a late replica", map[*replicaLengths]float64{c: 3})
	other := newReplicaLengths(t, srv, "other", 4096)
	must(other.sync(t))
	want("another layout", map[*replicaLengths]float64{other: 0})
	// A replica restarted under the same name (a StatefulSet's pod) reads
	// what its earlier process wrote: only this process's entries are its
	// own.
	again := newReplicaLengths(t, srv, "a", 8192)
	must(again.sync(t))
	want("a restarted replica", map[*replicaLengths]float64{again: 3})

	// Per-tenant counts travel too, and what a replica merged for a tenant
	// is not handed on with its own.
	a.teach(t, "t2", 7, 100)
	must(a.sync(t))
	must(b.sync(t))
	b.teach(t, "t2", 1, 100)
	d, ok, err := b.sched.LengthsDelta("m")
	must(err)
	if !ok || sumCounts(d.Tenants["t2"].Ended) != 1 {
		t.Fatalf("b's delta for t2: %+v; want its own one sample only", d.Tenants["t2"])
	}
}

func sumCounts(c []float64) float64 {
	var n float64
	for _, v := range c {
		n += v
	}
	return n
}

// A replica that restarts starts from the fleet's learned lengths before
// Start returns, so before the gateway admits anything: its first requests
// are predicted, not held at their worst case. Its earlier process had
// the same name.
func TestStartWarmsUpFromTheFleet(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	before := newReplicaLengths(t, srv, "a", 8192)
	if err := before.sync(t); err != nil { // starts counting
		t.Fatal(err)
	}
	before.teach(t, "", 150, 100)
	if err := before.sync(t); err != nil {
		t.Fatal(err)
	}
	cfg, err := parse(t, "{redis: '"+srv.URL()+"', replicas: 1, replica: a}")
	if err != nil {
		t.Fatal(err)
	}
	clock := admissiontest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	f := New(cfg, Deps{Clock: clock, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(f.Close)
	after := newReplicaLengths(t, srv, "a", 8192)
	if err := f.Start(after.sched, func() []string { return []string{"m"} }, nil); err != nil {
		t.Fatal(err)
	}
	if got := after.samples(); got != 150 {
		t.Fatalf("after Start the restarted replica predicts from %v samples, want the 150 its earlier process shared", got)
	}
}
