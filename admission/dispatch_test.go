package admission_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
)

// fleet is a config of GPUs (name → capacity, in order) and queues (name →
// its GPUs).
func fleet(gpus []admission.GPUConfig, queues map[string][]string, c admission.Config) admission.Config {
	c.GPUs = gpus
	c.Queues = nil
	for _, name := range sortedKeys(queues) {
		c.Queues = append(c.Queues, admission.QueueConfig{Name: name, GPUs: queues[name]})
	}
	return c
}

func sortedKeys(m map[string][]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	for i := range ks {
		for j := i + 1; j < len(ks); j++ {
			if ks[j] < ks[i] {
				ks[i], ks[j] = ks[j], ks[i]
			}
		}
	}
	return ks
}

func in(queue string, w int64) admission.Request { return admission.Request{Queue: queue, Weight: w} }

// poolsHeld is each GPU's held weight, "a=3 b=0".
func (f *fixture) gpusHeld() string {
	var parts []string
	for _, p := range f.b.Scheduler.Stats().GPUs {
		parts = append(parts, fmt.Sprintf("%s=%d", p.Name, p.Held))
	}
	return strings.Join(parts, " ")
}

func (f *fixture) held(want string) {
	f.t.Helper()
	if got := f.gpusHeld(); got != want {
		f.t.Fatalf("held %s, want %s", got, want)
	}
}

// A waiter is bound to whichever of its queue's GPUs frees room first, not
// to the one it would have been routed to on arrival.
func TestLateBindingToWhicheverGPUFreesFirst(t *testing.T) {
	f := newFixture(t, fleet([]admission.GPUConfig{{Name: "a", Capacity: 10}, {Name: "b", Capacity: 10}},
		map[string][]string{"m": {"a", "b"}}, admission.Config{}))
	x := f.acquire(in("m", 10))
	y := f.acquire(in("m", 10))
	if x.GPU() == y.GPU() {
		t.Fatalf("both on %q", x.GPU())
	}
	w := f.enqueue(context.Background(), in("m", 6))
	y.Release()
	tw := f.admitted(w)
	if tw.GPU() != y.GPU() {
		t.Fatalf("waiter bound to %q, the GPU that freed room is %q", tw.GPU(), y.GPU())
	}
	x.Release()
	tw.Release()
	f.held("a=0 b=0")
}

// Least loaded: the GPU with the most room after the request; several
// models on one GPU share it; a request of one model never waits behind
// another model's waiter on a GPU it does not use.
func TestRoutingSharingAndIndependentQueues(t *testing.T) {
	f := newFixture(t, fleet([]admission.GPUConfig{{Name: "a", Capacity: 10}, {Name: "b", Capacity: 20}, {Name: "c", Capacity: 10}},
		map[string][]string{"m": {"a", "b"}, "n": {"b"}, "o": {"c"}}, admission.Config{}))
	m1 := f.acquire(in("m", 5))
	if m1.GPU() != "b" {
		t.Fatalf("first request on %q, want the roomiest b", m1.GPU())
	}
	n1 := f.acquire(in("n", 15)) // b: 5+15 = 20, full
	m2 := f.acquire(in("m", 5))  // b is full: a
	if m2.GPU() != "a" {
		t.Fatalf("second m on %q, want a", m2.GPU())
	}
	nw := f.enqueue(context.Background(), in("n", 5)) // waits for b
	o1 := f.acquire(in("o", 10))                      // o's GPU c is untouched by n's waiter
	f.held("a=5 b=20 c=10")
	m1.Release()
	f.admitted(nw).Release()
	for _, tk := range []*admission.Ticket{n1, m2, o1} {
		tk.Release()
	}
	f.held("a=0 b=0 c=0")
}

// GPUs of different sizes behind one model are each filled to their own
// capacity.
func TestHeterogeneousGPUsFillToTheirOwnCapacity(t *testing.T) {
	f := newFixture(t, fleet([]admission.GPUConfig{{Name: "small", Capacity: 24}, {Name: "large", Capacity: 80}},
		map[string][]string{"m": {"small", "large"}}, admission.Config{}))
	var tks []*admission.Ticket
	for range 26 {
		tks = append(tks, f.acquire(in("m", 4)))
	}
	f.held("small=24 large=80")
	w := f.enqueue(context.Background(), in("m", 4))
	tks[0].Release()
	tks = append(tks[1:], f.admitted(w))
	for _, tk := range tks {
		tk.Release()
	}
}

// A GPU that becomes unavailable takes no new binds; its queue's waiters
// go to the others, and when no GPU is left they are refused at once.
func TestUnavailableGPUsAndNoRoute(t *testing.T) {
	f := newFixture(t, fleet([]admission.GPUConfig{{Name: "a", Capacity: 10}, {Name: "b", Capacity: 10}},
		map[string][]string{"m": {"a", "b"}}, admission.Config{}))
	s := f.b.Scheduler
	if err := s.SetAvailable("m", "a", false); err != nil {
		t.Fatal(err)
	}
	x := f.acquire(in("m", 8))
	if x.GPU() != "b" {
		t.Fatalf("bound to %q with a down", x.GPU())
	}
	w1 := f.enqueue(context.Background(), in("m", 5)) // a is down, b full
	w2 := f.enqueue(context.Background(), in("m", 5))
	if err := s.SetAvailable("m", "a", true); err != nil {
		t.Fatal(err)
	}
	t1 := f.admitted(w1)
	if t1.GPU() != "a" {
		t.Fatalf("w1 on %q", t1.GPU())
	}
	t2 := f.admitted(w2)
	if t2.GPU() != "a" {
		t.Fatalf("w2 on %q", t2.GPU())
	}
	w3 := f.enqueue(context.Background(), in("m", 5))
	if err := s.SetAvailable("m", "b", false); err != nil {
		t.Fatal(err)
	}
	f.stillQueued(w3) // a still serves it
	if err := s.SetAvailable("m", "a", false); err != nil {
		t.Fatal(err)
	}
	if re := f.refused(w3, admission.ErrNoRoute); re.RetryAfter != 0 {
		t.Fatalf("no route: %+v", re)
	}
	f.reject(in("m", 1), admission.ErrNoRoute)
	// Tickets bound to a GPU that went down still release into it.
	for _, tk := range []*admission.Ticket{x, t1, t2} {
		tk.Release()
	}
	f.held("a=0 b=0")
	for _, bad := range [][2]string{{"nope", "a"}, {"m", "nope"}} {
		if err := s.SetAvailable(bad[0], bad[1], true); err == nil {
			t.Errorf("SetAvailable(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

// Move takes a ticket off a GPU whose backend failed and binds it to
// another at its old place in the queue: held once, never twice.
func TestMoveRebindsElsewhereOnce(t *testing.T) {
	f := newFixture(t, fleet([]admission.GPUConfig{{Name: "a", Capacity: 10}, {Name: "b", Capacity: 10}},
		map[string][]string{"m": {"a", "b"}}, admission.Config{}))
	x := f.acquire(in("m", 6))
	from := x.GPU()
	other := map[string]string{"a": "b", "b": "a"}[from]
	if err := x.Move(context.Background()); err != nil {
		t.Fatal(err)
	}
	if x.GPU() != other || x.Weight() != 6 {
		t.Fatalf("after Move: %v weight %d", x, x.Weight())
	}
	f.held(map[string]string{"a": "a=0 b=6", "b": "a=6 b=0"}[from])
	// Moving again excludes the GPU it leaves: it goes back to the first.
	if err := x.Move(context.Background()); err != nil || x.GPU() != from {
		t.Fatalf("second Move: %v, on %q", err, x.GPU())
	}
	x.Release()
	if err := x.Move(context.Background()); !errors.Is(err, admission.ErrNotHeld) {
		t.Fatalf("Move of a released ticket: %v", err)
	}
	f.held("a=0 b=0")
}

// A move with nowhere else to go is refused, holding nothing; a move that
// must wait is cancelled by its context, holding nothing.
func TestMoveFailuresHoldNothing(t *testing.T) {
	f := newFixture(t, fleet([]admission.GPUConfig{{Name: "a", Capacity: 10}, {Name: "b", Capacity: 10}},
		map[string][]string{"m": {"a", "b"}, "solo": {"a"}}, admission.Config{}))
	solo := f.acquire(in("solo", 3))
	if err := solo.Move(context.Background()); !errors.Is(err, admission.ErrNoRoute) {
		t.Fatalf("Move with no other GPU: %v", err)
	}
	if solo.Weight() != 0 {
		t.Fatalf("refused move still holds %d", solo.Weight())
	}
	x := f.acquire(in("m", 10))
	y := f.acquire(in("m", 10))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Move(ctx) }()
	admissiontest.WaitQueued(f.b.Scheduler, 1)
	f.held(map[string]string{"a": "a=0 b=10", "b": "a=10 b=0"}[x.GPU()])
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || x.Weight() != 0 {
		t.Fatalf("cancelled move: %v, weight %d", err, x.Weight())
	}
	y.Release()
	f.held("a=0 b=0")
}

// Affinity picks the same GPU for the same key while it fits, and the
// least loaded one when it does not.
func TestAffinity(t *testing.T) {
	f := newFixture(t, fleet([]admission.GPUConfig{{Name: "a", Capacity: 10}, {Name: "b", Capacity: 10}, {Name: "c", Capacity: 10}},
		map[string][]string{"m": {"a", "b", "c"}}, admission.Config{}))
	sticky := admission.Request{Queue: "m", Weight: 3, Affinity: 42}
	first := f.acquire(sticky)
	second := f.acquire(sticky) // its GPU has 7 left, the others 10: affinity wins the tie-break
	if first.GPU() != second.GPU() {
		t.Fatalf("same key on %q and %q", first.GPU(), second.GPU())
	}
	third := f.acquire(sticky)
	fourth := f.acquire(sticky) // 3 more would pass 10: elsewhere
	if fourth.GPU() == first.GPU() {
		t.Fatalf("affinity overfilled %q", first.GPU())
	}
	spread := map[string]bool{}
	for k := uint64(1); k <= 64; k++ {
		tk := f.acquire(admission.Request{Queue: "m", Weight: 1, Affinity: k})
		spread[tk.GPU()] = true
		tk.Release()
	}
	if len(spread) != 3 {
		t.Fatalf("64 keys used GPUs %v", spread)
	}
	for _, tk := range []*admission.Ticket{first, second, third, fourth} {
		tk.Release()
	}
}

// A queue's waiters that can never fit any GPU after a resize are refused
// at once; a reload that removes a queue refuses its waiters with
// ErrNoRoute and keeps the tickets of the GPUs that stay.
func TestReconfigureFleet(t *testing.T) {
	cfg := fleet([]admission.GPUConfig{{Name: "a", Capacity: 10}, {Name: "b", Capacity: 10}},
		map[string][]string{"m": {"a", "b"}, "n": {"b"}}, admission.Config{})
	f := newFixture(t, cfg)
	s := f.b.Scheduler
	x := f.acquire(in("m", 10))
	y := f.acquire(in("m", 10))
	nw := f.enqueue(context.Background(), in("n", 5))
	mw := f.enqueue(context.Background(), in("m", 9))
	next := fleet([]admission.GPUConfig{{Name: "a", Capacity: 10}, {Name: "c", Capacity: 10}},
		map[string][]string{"m": {"a", "c"}}, admission.Config{})
	if err := s.Reconfigure(next); err != nil {
		t.Fatal(err)
	}
	f.refused(nw, admission.ErrNoRoute)
	tm := f.admitted(mw) // c is new and empty
	if tm.GPU() != "c" {
		t.Fatalf("m's waiter on %q", tm.GPU())
	}
	x.Release()
	y.Release()
	tm.Release()
	f.held("a=0 c=0")
	if _, err := s.Acquire(context.Background(), in("n", 1)); err == nil || !strings.Contains(err.Error(), "unknown") {
		t.Fatalf("removed queue: %v", err)
	}
}

// Issue 11 test finding: a moved ticket is bound again by whichever
// goroutine's release lets it in, while its owner may call Release at any
// moment — the gateway does when the client hangs up mid-move — and
// Release read the ticket's scheduler while the grant rewrote the whole
// ticket, a data race (-race catches it). Either order leaves the ticket
// held at most once.
func TestMoveAndReleaseFromItsOwner(t *testing.T) {
	f := newFixture(t, fleet([]admission.GPUConfig{{Name: "a", Capacity: 10}, {Name: "b", Capacity: 10}},
		map[string][]string{"m": {"a", "b"}}, admission.Config{}))
	x := f.acquire(in("m", 10))
	y := f.acquire(in("m", 10))
	moved := make(chan error, 1)
	go func() { moved <- x.Move(context.Background()) }()
	admissiontest.WaitQueued(f.b.Scheduler, 1)
	start, released := make(chan struct{}), make(chan struct{})
	go func() {
		<-start
		x.Release()
		close(released)
	}()
	close(start)
	y.Release() // lets x in where y was, while its owner releases it
	<-released
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	x.Release()
	f.held("a=0 b=0")
}
