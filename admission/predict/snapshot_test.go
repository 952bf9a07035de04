package predict_test

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/admission/predict"
)

func sameSurvival(t *testing.T, a, b *predict.Lengths, upTo int) {
	t.Helper()
	for x := -1; x <= upTo; x++ {
		if sa, sb := a.Survival(x), b.Survival(x); math.Abs(sa-sb) > tol {
			t.Fatalf("Survival(%d): %v vs %v", x, sa, sb)
		}
	}
}

func TestSnapshotMergeRoundTrip(t *testing.T) {
	cfg := predict.LengthsConfig{MaxLen: 4096}
	src := learn(t, cfg, sample{3, false}, sample{5, true}, sample{200, false}, sample{1024, true}, sample{9000, false})
	data, err := json.Marshal(src.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var s predict.Snapshot
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	dst := learn(t, cfg)
	if err := dst.Merge(s); err != nil {
		t.Fatal(err)
	}
	if dst.Samples() != src.Samples() {
		t.Fatalf("Samples %v after merge, want %v", dst.Samples(), src.Samples())
	}
	sameSurvival(t, src, dst, 5000)

	// Merging a replica's counts is observing its samples here.
	other := learn(t, cfg, sample{7, false}, sample{300, true})
	both := learn(t, cfg, sample{3, false}, sample{5, true}, sample{200, false}, sample{1024, true}, sample{9000, false},
		sample{7, false}, sample{300, true})
	if err := dst.Merge(other.Snapshot()); err != nil {
		t.Fatal(err)
	}
	sameSurvival(t, both, dst, 5000)
}

func TestSnapshotIsACopy(t *testing.T) {
	l := learn(t, predict.LengthsConfig{MaxLen: 100}, ended(5)...)
	s := l.Snapshot()
	s.Ended[5] = 1000
	if l.Samples() != 1 || l.Survival(4) != 1 || l.Survival(5) != 0 {
		t.Fatal("writing to a snapshot changed the Lengths")
	}
}

func TestMergeDecays(t *testing.T) {
	cfg := predict.LengthsConfig{MaxLen: 100, Window: 2}
	big := learn(t, predict.LengthsConfig{MaxLen: 100, Window: 1000}, ended(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)...)
	l := learn(t, cfg)
	if err := l.Merge(big.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if got := l.Samples(); got != 18.0/8 { // 18 → 9 → 4.5 → 2.25: halved until within 2×Window
		t.Fatalf("Samples after merging 18 into Window 2 = %v, want 2.25", got)
	}
}

func TestMergeRefuses(t *testing.T) {
	cfg := predict.LengthsConfig{MaxLen: 100}
	good := learn(t, cfg, ended(1, 2)...).Snapshot()
	withCount := func(c float64) predict.Snapshot {
		s := learn(t, cfg).Snapshot()
		s.Capped[3] = c
		return s
	}
	for _, tc := range []struct {
		name string
		s    predict.Snapshot
		want string
	}{
		{"other MaxLen", learn(t, predict.LengthsConfig{MaxLen: 200}).Snapshot(), "layout"},
		{"other scheme", predict.Snapshot{Layout: "hdr/3", Ended: good.Ended, Capped: good.Capped}, "layout"},
		{"short", predict.Snapshot{Layout: good.Layout, Ended: good.Ended[:3], Capped: good.Capped}, "buckets"},
		{"negative", withCount(-1), "count -1"},
		{"NaN", withCount(math.NaN()), "count NaN"},
		{"infinite", withCount(math.Inf(1)), "count +Inf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := learn(t, cfg, ended(7)...)
			err := l.Merge(tc.s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Merge = %v, want an error about %q", err, tc.want)
			}
			if l.Samples() != 1 || l.Survival(6) != 1 || l.Survival(7) != 0 {
				t.Fatal("a refused merge changed the Lengths")
			}
		})
	}
}
