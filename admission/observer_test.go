package admission_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/internal/confval"
)

// Every exit from Acquire reaches the observer exactly once, with its wait.
func TestObserverTranscript(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{Tenants: []admission.TenantConfig{{Name: "a", Share: 0.5}},
		Classes: []admission.ClassConfig{{Name: "standard", ClassLimits: admission.ClassLimits{MaxQueued: 2, QueueTimeout: confval.Duration{D: 4 * time.Second}}}}}))
	hold := f.acquire(req("", "a", 5))
	f.reject(req("", "a", 6), admission.ErrTenantQuota)
	f.reject(std(11), admission.ErrTooLarge)
	other := f.acquire(std(5))
	queued := f.enqueue(context.Background(), std(3))
	ctx, cancel := context.WithCancel(context.Background())
	gone := f.enqueue(ctx, std(1))
	f.reject(std(1), admission.ErrQueueFull)
	f.clock.Advance(time.Second)
	cancel()
	<-gone
	f.clock.Advance(time.Second)
	other.Release()
	f.admitted(queued).Release()
	timeout := f.enqueue(context.Background(), std(9))
	f.clock.Advance(4 * time.Second)
	f.refused(timeout, admission.ErrQueueTimeout)
	hold.Release()

	want := []admissiontest.Event{
		{Admitted: true, GPU: gpu, Class: "standard", Tenant: "a", Weight: 5},
		{Class: "standard", Tenant: "a", Reason: "tenant_quota", Weight: 6},
		{Class: "standard", Reason: "too_large", Weight: 11},
		{Admitted: true, GPU: gpu, Class: "standard", Weight: 5},
		{Class: "standard", Reason: "queue_full", Weight: 1},
		{Class: "standard", Reason: "canceled", Weight: 1, Waited: time.Second},
		{Admitted: true, GPU: gpu, Class: "standard", Weight: 3, Waited: 2 * time.Second},
		{Class: "standard", Reason: "queue_timeout", Weight: 9, Waited: 4 * time.Second},
	}
	if got := f.rec.Events(); !reflect.DeepEqual(got, want) {
		t.Fatalf("transcript:\n got %v\nwant %v", got, want)
	}
	s := f.b.Stats()
	wantRejected := map[string]int64{"too_large": 1, "queue_full": 1, "queue_timeout": 1, "overloaded": 0, "tenant_quota": 1, "no_route": 0}
	if s.Admitted != 3 || s.AdmittedAfterWait != 1 || s.Canceled != 1 || !reflect.DeepEqual(s.Rejected, wantRejected) {
		t.Fatalf("counters: %+v", s)
	}
}

func TestStats(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{PressureThreshold: 1,
		Tenants: []admission.TenantConfig{{Name: "a", Share: 0.5}, {Name: "idle", Share: 0.1}}}))
	a := f.acquire(req("critical", "a", 50))
	b := f.acquire(admission.Request{Class: "standard", Tenant: "zed", Shape: chunks(4, 10).Shape})
	f.enqueue(context.Background(), req("standard", "a", 20))
	f.enqueue(context.Background(), req("sheddable", "", 25)) // 80+25 > 100 after the shrink
	f.clock.Advance(time.Second)
	b.Done(0, 10, false)
	got := f.b.Scheduler.Stats()
	want := admission.Stats{
		Queued: 2, Admitted: 2,
		Rejected:   map[string]int64{"too_large": 0, "queue_full": 0, "queue_timeout": 0, "overloaded": 0, "tenant_quota": 0, "no_route": 0},
		Trips:      map[string]int64{admission.TripDrift: 0, admission.TripGuard: 0, admission.TripOverflow: 0},
		DriftTrips: map[string]int64{admission.DriftQueue: 0, admission.DriftTenant: 0, admission.DriftClass: 0},
		GPUs: []admission.GPUStats{{Name: gpu, Capacity: 100, Effective: 100, Limit: -1, Margin: 1, Held: 80, Committed: 80, Charge: 80,
			Tickets: 2, Now: 59, DrainRate: 10, Releases: 1}}, // now: a whole (no shape), b at its progress plus lead
		Queues: []admission.QueueStats{{Name: "", Queued: 2, QueuedBytes: 45,
			Classes: []admission.ClassStats{
				{Name: "critical", Held: 50},
				{Name: "standard", Held: 30, Queued: 1, QueuedBytes: 20},
				{Name: "sheddable", Queued: 1, QueuedBytes: 25},
			},
			GPUs:    []admission.RouteStats{{GPU: gpu, Up: true}},
			Samples: 1, MedianLength: 10, P90Length: 10,
		}},
		Tenants: []admission.TenantStats{
			{Name: "", Queued: 1, QueuedBytes: 25},
			{Name: "a", Held: 50, Queued: 1, QueuedBytes: 20},
			{Name: "idle"},
			{Name: "zed", Held: 30},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Stats:\n got %+v\nwant %+v", got, want)
	}
	a.Release()
	b.Release()
}
