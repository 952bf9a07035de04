package admission_test

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/internal/confval"
)

// The same operations on a Budget and on a bare x/sync semaphore, in the
// same run: uncontended (one goroutine, always fits), contended where
// everything fits (64 goroutines, lock contention only), and contended with
// queueing (64 goroutines on room for 8).

func newBenchBudget(b *testing.B, capacity int64) *admission.Scheduler {
	b.Helper()
	return newBenchScheduler(b, capacity, admission.WorstCase)
}

func newBenchScheduler(b *testing.B, capacity int64, policy string) *admission.Scheduler {
	b.Helper()
	s, err := admission.New(oneGPU(capacity, admission.Config{Classes: []admission.ClassConfig{
		{Name: "critical"}, {Name: "standard", ClassLimits: admission.ClassLimits{MaxQueued: 1 << 20, MaxQueuedBytes: confval.Size{Bytes: -1}, QueueTimeout: confval.Duration{D: -1}}}},
		Tenants: []admission.TenantConfig{{Name: "acme", Share: 1}},
		Policy:  admission.PolicyConfig{Reservation: policy, WarmupSamples: -1}}))
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	b.Run("uncontended/semaphore", func(b *testing.B) {
		sem := semaphore.NewWeighted(1 << 40)
		b.ReportAllocs()
		for b.Loop() {
			if err := sem.Acquire(ctx, 1000); err != nil {
				b.Fatal(err)
			}
			sem.Release(1000)
		}
	})
	for _, r := range []struct {
		name string
		req  admission.Request
	}{
		{"admission", admission.Request{Weight: 1000}},
		{"admission-tenant-class", admission.Request{Weight: 1000, Class: "standard", Tenant: "acme"}},
		{"admission-unlisted-tenant", admission.Request{Weight: 1000, Tenant: "walk-in"}},
	} {
		b.Run("uncontended/"+r.name, func(b *testing.B) {
			bud := newBenchBudget(b, 1<<40)
			b.ReportAllocs()
			for b.Loop() {
				tk, err := bud.Acquire(ctx, r.req)
				if err != nil {
					b.Fatal(err)
				}
				tk.Release()
			}
		})
	}

	b.Run("uncontended/admission-AcquireTicket", func(b *testing.B) {
		bud := newBenchBudget(b, 1<<40)
		var tk admission.Ticket
		b.ReportAllocs()
		for b.Loop() {
			if err := bud.AcquireTicket(ctx, admission.Request{Weight: 1000}, &tk); err != nil {
				b.Fatal(err)
			}
			tk.Release()
		}
	})

	for _, c := range []struct {
		name     string
		capacity int64
	}{{"fits", 1 << 40}, {"queueing", 8 * 1000}} {
		b.Run("contended-64-"+c.name+"/semaphore", func(b *testing.B) {
			sem := semaphore.NewWeighted(c.capacity)
			b.ReportAllocs()
			parallel64(b, func() {
				if err := sem.Acquire(ctx, 1000); err != nil {
					b.Error(err)
					return
				}
				sem.Release(1000)
			})
		})
		b.Run("contended-64-"+c.name+"/admission", func(b *testing.B) {
			bud := newBenchBudget(b, c.capacity)
			b.ReportAllocs()
			parallel64(b, func() {
				tk, err := bud.Acquire(ctx, admission.Request{Weight: 1000})
				if err != nil {
					b.Error(err)
					return
				}
				tk.Release()
			})
			if s := bud.Stats(); s.GPUs[0].Held != 0 || s.Queued != 0 {
				b.Fatalf("left behind: %+v", s)
			}
		})
	}
}

// parallel64 runs op b.N times over 64 goroutines, whatever GOMAXPROCS is.
func parallel64(b *testing.B, op func()) {
	procs := testingProcs()
	b.SetParallelism((64 + procs - 1) / procs)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			op()
		}
	})
}

// BenchmarkUncontendedRatio alternates batches of the same Acquire+Release
// on a Budget and on a bare semaphore, so that a busy machine slows both
// alike, and reports each one's cost and their ratio (the target is < 3).
func BenchmarkUncontendedRatio(b *testing.B) {
	const batch = 512
	ctx := context.Background()
	bud := newBenchBudget(b, 1<<40)
	sem := semaphore.NewWeighted(1 << 40)
	var own admission.Ticket
	var tSem, tBud, tOwn time.Duration
	for b.Loop() {
		t1 := time.Now()
		for range batch {
			_ = sem.Acquire(ctx, 1000)
			sem.Release(1000)
		}
		t2 := time.Now()
		for range batch {
			tk, err := bud.Acquire(ctx, admission.Request{Weight: 1000})
			if err != nil {
				b.Fatal(err)
			}
			tk.Release()
		}
		t3 := time.Now()
		for range batch {
			if err := bud.AcquireTicket(ctx, admission.Request{Weight: 1000}, &own); err != nil {
				b.Fatal(err)
			}
			own.Release()
		}
		tOwn += time.Since(t3)
		tBud += t3.Sub(t2)
		tSem += t2.Sub(t1)
	}
	n := float64(b.N * batch)
	b.ReportMetric(float64(tSem.Nanoseconds())/n, "semaphore-ns/op")
	b.ReportMetric(float64(tBud.Nanoseconds())/n, "Acquire-ns/op")
	b.ReportMetric(float64(tOwn.Nanoseconds())/n, "AcquireTicket-ns/op")
	b.ReportMetric(float64(tBud)/float64(tSem), "Acquire-ratio")
	b.ReportMetric(float64(tOwn)/float64(tSem), "AcquireTicket-ratio")
}

// BenchmarkShapedAcquireRelease is a chat request's Acquire, a few
// Progress reports, Done and Release, with 128 other requests running on the
// GPU, under each policy: what the gateway pays per request.
func BenchmarkShapedAcquireRelease(b *testing.B) {
	ctx := context.Background()
	shape := []admission.Group{{Prompt: 256, Cap: 1024, Seqs: 1, BlockTokens: 16, BlockBytes: 128 << 10}}
	// opaque is a non-streamed request: no progress until it is done.
	for _, bc := range []struct {
		policy string
		opaque bool
	}{{admission.WorstCase, false}, {admission.Predicted, false}, {admission.Predicted, true}} {
		name := bc.policy
		if bc.opaque {
			name += "_opaque"
		}
		r := admission.Request{Shape: shape, Opaque: bc.opaque}
		b.Run(name, func(b *testing.B) {
			s := newBenchScheduler(b, 1<<40, bc.policy)
			for i := range 1000 { // a learned distribution
				tk, err := s.Acquire(ctx, r)
				if err != nil {
					b.Fatal(err)
				}
				tk.Done(0, 50+i%400, false)
			}
			var running []*admission.Ticket
			for range 128 {
				tk, err := s.Acquire(ctx, r)
				if err != nil {
					b.Fatal(err)
				}
				if !bc.opaque {
					tk.Progress(0, 100)
				}
				running = append(running, tk)
			}
			var tk admission.Ticket
			b.ReportAllocs()
			for b.Loop() {
				if err := s.AcquireTicket(ctx, r, &tk); err != nil {
					b.Fatal(err)
				}
				for g := 16; g <= 64 && !bc.opaque; g += 16 {
					tk.Progress(0, g)
				}
				tk.Done(0, 70, false)
				tk.Release()
			}
			for _, t := range running {
				t.Release()
			}
		})
	}
}

// BenchmarkSharedAcquireRelease is BenchmarkShapedAcquireRelease's request
// with a 4092-token prompt (255 shareable blocks) on a GPU that shares
// prompt blocks: each request's own prompt (nothing found held, every
// block entered and taken out again), one prompt for all (every block
// found), and the same request on a GPU that does not share, for scale.
func BenchmarkSharedAcquireRelease(b *testing.B) {
	ctx := context.Background()
	const prompt, blocks = 4092, 4092 / 16
	for _, bc := range []struct {
		name    string
		sharing bool
		common  bool
	}{{"not_sharing", false, false}, {"unique_prompts", true, false}, {"one_prompt", true, true}} {
		for _, policy := range []string{admission.WorstCase, admission.Predicted} {
			b.Run(bc.name+"/"+policy, func(b *testing.B) {
				s := newBenchScheduler(b, 1<<40, policy)
				if err := s.SetSharing(gpu, bc.sharing); err != nil {
					b.Fatal(err)
				}
				next := uint64(1)
				request := func() admission.Request {
					p := make([]uint64, blocks)
					for j := range p {
						p[j] = next<<32 | uint64(j)
					}
					if !bc.common {
						next++
					}
					return admission.Request{Shape: []admission.Group{{Prompt: prompt, Cap: 1024, Seqs: 1, BlockTokens: 16, BlockBytes: 128 << 10, Prefix: p}}}
				}
				var running []*admission.Ticket
				for range 128 {
					tk, err := s.Acquire(ctx, request())
					if err != nil {
						b.Fatal(err)
					}
					tk.Progress(0, 100)
					running = append(running, tk)
				}
				reqs := make([]admission.Request, 64)
				for i := range reqs {
					reqs[i] = request()
				}
				var tk admission.Ticket
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if err := s.AcquireTicket(ctx, reqs[i%len(reqs)], &tk); err != nil {
						b.Fatal(err)
					}
					i++
					for g := 16; g <= 64; g += 16 {
						tk.Progress(0, g)
					}
					tk.Done(0, 70, false)
					tk.Release()
				}
				for _, t := range running {
					t.Release()
				}
			})
		}
	}
}
