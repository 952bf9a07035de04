package admission_test

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
)

// views is a CacheView by hand: what each GPU holds of a family's prompt
// blocks (a leading run), and whether it can say.
type views map[string]cache

// cache is what one GPU holds: the leading blocks of family fam.
type cache struct {
	fam    uint64
	blocks int
	ok     bool
}

var _ admission.CacheView = views(nil)

func (v views) Cached(gpu string, prefix []uint64) (int, bool) {
	c := v[gpu]
	if !c.ok {
		return 0, false
	}
	n := 0
	for _, name := range prefix {
		if name>>32 != c.fam || int(name&0xffffffff) >= c.blocks {
			break
		}
		n++
	}
	return n, true
}

func twoGPUs(t *testing.T) *admission.Scheduler {
	t.Helper()
	s, err := admission.New(admission.Config{
		GPUs:   []admission.GPUConfig{{Name: "a", Capacity: 1000}, {Name: "b", Capacity: 2000}},
		Queues: []admission.QueueConfig{{Name: "", GPUs: []string{"a", "b"}}},
		Clock:  admissiontest.NewClock(t0),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestBindingByCache(t *testing.T) {
	for _, tc := range []struct {
		name string
		view views
		load map[string]int // prompt tokens of requests admitted first, of another family, per GPU
		want string
	}{
		{"no view: the most room", nil, nil, "b"},
		{"a holds the prompt cached: a, despite less room",
			views{"a": cache{1, 100, true}, "b": cache{1, 0, true}}, nil, "a"},
		{"a holds part of it and is loaded more: still a, where it fits",
			views{"a": cache{1, 20, true}, "b": cache{1, 0, true}}, map[string]int{"a": 40 * 16}, "a"},
		{"a holds it but cannot fit it: b",
			views{"a": cache{1, 100, true}, "b": cache{1, 0, true}}, map[string]int{"a": 900 * 16}, "b"},
		{"both hold it alike: the less loaded, though it has less room",
			views{"a": cache{1, 100, true}, "b": cache{1, 100, true}}, map[string]int{"b": 10 * 16}, "a"},
		{"b's view cannot say: as without a view",
			views{"a": cache{1, 100, true}, "b": cache{1, 0, false}}, nil, "b"},
		{"another family cached: no saving, the least loaded",
			views{"a": cache{2, 100, true}, "b": cache{2, 100, true}}, map[string]int{"b": 10 * 16}, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := twoGPUs(t)
			ctx := context.Background()
			// Load first, each pinned to its GPU by filling it alone.
			for g, tokens := range tc.load {
				other := map[string]string{"a": "b", "b": "a"}[g]
				if err := s.SetAvailable("", other, false); err != nil {
					t.Fatal(err)
				}
				tk, err := s.Acquire(ctx, shared(9, tokens, 1))
				if err != nil {
					t.Fatal(err)
				}
				defer tk.Release()
				if err := s.SetAvailable("", other, true); err != nil {
					t.Fatal(err)
				}
			}
			if tc.view != nil {
				s.SetCacheView(tc.view)
			}
			tk, err := s.Acquire(ctx, shared(1, 1604, 64))
			if err != nil {
				t.Fatal(err)
			}
			defer tk.Release()
			if tk.GPU() != tc.want {
				t.Fatalf("bound to %q, want %q", tk.GPU(), tc.want)
			}
		})
	}
}

// Where a view sees a sharing GPU's cache, a prompt block counts once for
// several requests only if the backend holds it: a name the backend does
// not share never lowers a charge. Two requests of one 100-block prompt,
// 5 blocks of their own each (see TestSharedPromptBlocksAreHeldOnce).
func TestSharingByTheBackendsAccount(t *testing.T) {
	for _, tc := range []struct {
		name         string
		view         views
		held, shared int64
	}{
		{"no view: the gateway's names", nil, 110, 100},
		{"the backend holds the prompt", views{gpu: cache{1, 100, true}}, 110, 100},
		{"the backend holds 40 of its blocks", views{gpu: cache{1, 40, true}}, 40 + 2*(60+5), 40},
		{"the backend holds none of them", views{gpu: cache{1, 0, true}}, 2 * 105, 0},
		{"the view cannot say: the gateway's names", views{gpu: cache{1, 0, false}}, 110, 100},
	} {
		for _, policy := range []string{admission.WorstCase, admission.Predicted} {
			t.Run(tc.name+"/"+policy, func(t *testing.T) {
				f := sharingFixture(t, 1000, policy)
				if tc.view != nil {
					f.b.SetCacheView(tc.view)
				}
				for range 2 {
					tk, err := f.b.Acquire(context.Background(), shared(1, 1604, 64))
					if err != nil {
						t.Fatal(err)
					}
					defer tk.Release()
				}
				if st := gpuStats(t, f.b.Scheduler); st.Held != tc.held || st.Shared != tc.shared {
					t.Fatalf("held %d, shared %d; want %d, %d", st.Held, st.Shared, tc.held, tc.shared)
				}
			})
		}
	}
}

// A prompt the backend stores after its first request was admitted counts
// again for the next one, while the first runs: an over-count, never an
// under-count.
func TestSharingAfterTheBackendStored(t *testing.T) {
	f := sharingFixture(t, 1000, admission.WorstCase)
	f.b.SetCacheView(views{gpu: cache{1, 0, true}})
	ctx := context.Background()
	a, err := f.b.Acquire(ctx, shared(1, 1604, 64))
	if err != nil {
		t.Fatal(err)
	}
	f.b.SetCacheView(views{gpu: cache{1, 100, true}})
	b, err := f.b.Acquire(ctx, shared(1, 1604, 64))
	if err != nil {
		t.Fatal(err)
	}
	if st := gpuStats(t, f.b.Scheduler); st.Held != 105+100+5 || a.Weight() != 105 || b.Weight() != 5 {
		t.Fatalf("held %d, weights %d and %d; want 210, 105, 5", st.Held, a.Weight(), b.Weight())
	}
	a.Release()
	if st := gpuStats(t, f.b.Scheduler); st.Held != 105 {
		t.Fatalf("after the first: held %d, want 105", st.Held)
	}
	b.Release()
	if st := gpuStats(t, f.b.Scheduler); st.Held != 0 || st.Shared != 0 {
		t.Fatalf("after both: held %d, shared %d", st.Held, st.Shared)
	}
}
