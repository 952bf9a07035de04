package admission_test

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/admission"
)

func (f *fixture) capacity(nominal, effective int64) {
	f.t.Helper()
	if s := f.b.Stats(); s.Capacity != nominal || s.Effective != effective {
		f.t.Fatalf("capacity %d effective %d, want %d %d", s.Capacity, s.Effective, nominal, effective)
	}
}

func TestResizeDownRevokesNothingAndStopsAdmissions(t *testing.T) {
	f := newFixture(t, oneGPU(100, admission.Config{Tenants: []admission.TenantConfig{{Name: "half", Share: 0.5}}}))
	a := f.acquire(std(40))
	b := f.acquire(req("", "half", 40))
	tooLarge := f.enqueue(context.Background(), std(70))            // fits 100, not 50
	overCap := f.enqueue(context.Background(), req("", "half", 30)) // fits half's 50, not its 25
	if err := f.b.Resize(50); err != nil {
		t.Fatal(err)
	}
	f.capacity(50, 50)
	f.refused(tooLarge, admission.ErrTooLarge)
	if re := f.refused(overCap, admission.ErrTenantQuota); re.Capacity != 25 {
		t.Fatalf("tenant cap after resize: %+v", re)
	}
	f.state(80, 0) // held stays above the new capacity
	if free := f.b.Free(); free != -30 {
		t.Fatalf("Free = %d, want -30", free)
	}
	w := f.enqueue(context.Background(), std(10))
	a.Release() // held 40: 40+10 <= 50
	f.admitted(w).Release()
	b.Release()
	f.state(0, 0)
}

func TestResizeUpAdmitsWaiters(t *testing.T) {
	f := newFixture(t, oneGPU(10, admission.Config{}))
	hold := f.acquire(std(10))
	w := f.enqueue(context.Background(), std(10))
	if err := f.b.Resize(20); err != nil {
		t.Fatal(err)
	}
	f.admitted(w).Release()
	hold.Release()
	f.capacity(20, 20)
	f.acquire(std(20)).Release()
}

func TestResizeKeepsTheAIMDRatioAndRejectsBadSizes(t *testing.T) {
	f := newFixture(t, oneGPU(1000, admission.Config{AIMD: admission.AIMDConfig{Decrease: 0.5}}))
	f.b.Feedback(true)
	f.capacity(1000, 500)
	if err := f.b.Resize(2000); err != nil {
		t.Fatal(err)
	}
	f.capacity(2000, 1000)
	for _, c := range []int64{0, -1} {
		if err := f.b.Resize(c); err == nil {
			t.Fatalf("Resize(%d) accepted", c)
		}
	}
	f.capacity(2000, 1000)
}

func TestFeedbackAIMD(t *testing.T) {
	f := newFixture(t, oneGPU(1000, admission.Config{AIMD: admission.AIMDConfig{Decrease: 0.5, Increase: 0.1, MinFraction: 0.2}}))
	hold := f.acquire(std(600))
	for _, want := range []int64{500, 250, 200, 200} { // multiplicative, floored at 0.2 × 1000
		f.b.Feedback(true)
		f.capacity(1000, want)
	}
	f.state(600, 0) // nothing revoked
	w := f.enqueue(context.Background(), std(1))
	for _, want := range []int64{300, 400, 500, 600} { // additive: 0.1 × 1000 per report
		f.b.Feedback(false)
		f.capacity(1000, want)
		f.state(600, 1) // 601 does not fit in <= 600
	}
	f.b.Feedback(false)
	f.capacity(1000, 700)
	tw := f.admitted(w)
	for range 5 {
		f.b.Feedback(false)
	}
	f.capacity(1000, 1000) // never above nominal
	tw.Release()
	hold.Release()
}

func TestFeedbackDefaults(t *testing.T) {
	f := newFixture(t, oneGPU(1000, admission.Config{}))
	for _, want := range []int64{900, 810, 729} {
		f.b.Feedback(true)
		f.capacity(1000, want)
	}
	for range 30 {
		f.b.Feedback(true)
	}
	f.capacity(1000, 250) // DefaultAIMDMinFraction
	f.b.Feedback(false)
	f.capacity(1000, 260) // DefaultAIMDIncrease of 1000
}
