package admission_test

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
)

// views is a CacheView by hand: what each GPU holds of a family's prompt
// blocks (a leading run), and whether it can say.
type views map[string]struct {
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
	type cache = struct {
		fam    uint64
		blocks int
		ok     bool
	}
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
