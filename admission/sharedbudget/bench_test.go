package sharedbudget_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/sharedbudget"
	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
)

// One grant and one return: the two round trips a chunk of demand change
// costs on loopback Redis.
func BenchmarkRedisAcquireRelease(b *testing.B) {
	srv := sharedbudgettest.StartRedis(b)
	s := sharedbudget.NewRedis(srv.Client(), sharedbudget.RedisOptions{Prefix: "bench:"})
	benchAcquireRelease(b, s)
}

func BenchmarkMemoryAcquireRelease(b *testing.B) {
	benchAcquireRelease(b, sharedbudget.NewMemory(nil))
}

func benchAcquireRelease(b *testing.B, s sharedbudget.Store) {
	ctx := context.Background()
	r := sharedbudget.Request{Replica: "a", Budget: 1 << 40, TTL: 3 * time.Second}
	b.ReportAllocs()
	for b.Loop() {
		if l, err := s.Acquire(ctx, "gpu0", r, 1<<30, 1); err != nil || l.Granted == 0 {
			b.Fatal(l, err)
		}
		if _, err := s.Release(ctx, "gpu0", r, 1<<30); err != nil {
			b.Fatal(err)
		}
	}
}

// What the request path pays for the shared budget: one Wake per change of
// the pool's demand.
func BenchmarkLesseeWake(b *testing.B) {
	l, err := sharedbudget.NewLessee(sharedbudget.LesseeConfig{
		Store: sharedbudget.NewMemory(nil), Key: "gpu0", Replica: "a", Replicas: 1, Budget: 1000, Chunk: 100,
		Demand: func() (int64, int64) { return 0, 0 }, OnCapacity: func(int64) {},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Wake()
		}
	})
}
