package predict_test

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/admission/predict"
)

func curve(it predict.Item) (mean, variance []float64) {
	mean, variance = make([]float64, predict.GridLen), make([]float64, predict.GridLen)
	it.AddTo(mean, variance)
	return mean, variance
}

// prefix is want followed by zeros up to GridLen.
func prefix(want ...float64) []float64 {
	out := make([]float64, predict.GridLen)
	copy(out, want)
	return out
}

func repeat(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func concat(parts ...[]float64) []float64 {
	var out []float64
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func sameCurve(t *testing.T, what string, got, want []float64) {
	t.Helper()
	for k := range got {
		if math.Abs(got[k]-want[k]) > 1e-9 {
			t.Fatalf("%s[%d] (step %d) = %v, want %v\ngot  %v\nwant %v", what, k, predict.Steps()[k], got[k], want[k], got[:24], want[:24])
		}
	}
}

// twoPoint has half its sequences end at 2 tokens and half at 6.
func twoPoint(t *testing.T) *predict.Lengths {
	return learn(t, predict.LengthsConfig{MaxLen: 1000}, ended(2, 6, 2, 6)...)
}

func TestAddToDeterministic(t *testing.T) {
	for _, tc := range []struct {
		name        string
		it          predict.Item
		mean        []float64
		now, final  int64
		remaining90 int
	}{
		{
			// 20 prompt tokens, blocks of 16: the item holds 20+t+1 tokens at step t,
			// 2 blocks up to t = 11, 3 from t = 12. Past step 15 the grid is 16, 18,
			// 20: index 16 covers steps 16–17 (size at 17: 38 tokens), index 17 steps
			// 18–19; at step 20 it has reached its cap of 20 and is gone.
			name:        "block rounding and cap cut-off",
			it:          predict.Item{Prompt: 20, Cap: 20, Seqs: 1, BlockTokens: 16, BlockBytes: 1},
			mean:        concat(repeat(2, 12), repeat(3, 6)),
			now:         2,
			final:       3,
			remaining90: 20,
		},
		{
			// The backend may be 5 tokens ahead: sizes are 5 tokens larger (capped at
			// the cap), the end stays where the gateway's count puts it.
			name:        "lead",
			it:          predict.Item{Prompt: 20, Cap: 20, Seqs: 1, BlockTokens: 16, BlockBytes: 1, Lead: 5},
			mean:        concat(repeat(2, 7), repeat(3, 11)),
			now:         2,
			final:       3,
			remaining90: 20,
		},
		{
			// Generated 15 of 20, no prompt, blocks of 4: 16 tokens at step 0, then 17
			// to 20; gone at step 5.
			name:        "part generated",
			it:          predict.Item{Generated: 15, Cap: 20, Seqs: 1, BlockTokens: 4, BlockBytes: 10},
			mean:        prefix(40, 50, 50, 50, 50),
			now:         40,
			final:       50,
			remaining90: 5,
		},
		{
			name:        "at its cap: held at step 0 only",
			it:          predict.Item{Generated: 20, Cap: 20, Seqs: 1, BlockTokens: 4, BlockBytes: 10},
			mean:        prefix(50),
			now:         50,
			final:       50,
			remaining90: 0,
		},
		{
			// 3 sequences share the prompt's 2 full blocks (40 tokens, blocks of 16);
			// each holds its own partial block: 1 block up to 48 tokens, 2 after.
			name:        "shared prompt",
			it:          predict.Item{Prompt: 40, Cap: 10, Seqs: 3, BlockTokens: 16, BlockBytes: 1000},
			mean:        concat(repeat(5000, 8), repeat(8000, 2)),
			now:         5000,
			final:       8000,
			remaining90: 10,
		},
		{
			name:        "invalid fields are clamped",
			it:          predict.Item{Prompt: -3, Generated: -2, Cap: 2, Seqs: 0, BlockTokens: 0, BlockBytes: 0, Lead: -1},
			mean:        prefix(1, 2),
			now:         1,
			final:       2,
			remaining90: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mean, variance := curve(tc.it)
			sameCurve(t, "mean", mean, prefix(tc.mean...))
			sameCurve(t, "variance", variance, prefix())
			if got := tc.it.Now(); got != tc.now {
				t.Errorf("Now = %d, want %d", got, tc.now)
			}
			if got := tc.it.Final(); got != tc.final {
				t.Errorf("Final = %d, want %d", got, tc.final)
			}
			if got := tc.it.Remaining(0.9); got != tc.remaining90 {
				t.Errorf("Remaining(0.9) = %d, want %d", got, tc.remaining90)
			}
		})
	}
}

func TestAddToTwoPointDistribution(t *testing.T) {
	l := twoPoint(t)
	for _, tc := range []struct {
		name           string
		it             predict.Item
		mean, variance []float64
	}{
		{
			// One token per block and byte. Alive for sure at steps 0 and 1 (holding
			// 1 and 2 tokens); from step 2 only the half that ends at 6 is left,
			// holding t+1 tokens: mean (t+1)/2, variance (t+1)²/4, until step 5.
			name:     "fresh",
			it:       predict.Item{Cap: 100, Seqs: 1, BlockTokens: 1, BlockBytes: 1, Lengths: l},
			mean:     prefix(1, 2, 1.5, 2, 2.5, 3),
			variance: prefix(0, 0, 2.25, 4, 6.25, 9),
		},
		{
			// The cap at 4 cuts the tail: steps 2 and 3 are still uncertain.
			name:     "cap before the long ones end",
			it:       predict.Item{Cap: 4, Seqs: 1, BlockTokens: 1, BlockBytes: 1, Lengths: l},
			mean:     prefix(1, 2, 1.5, 2),
			variance: prefix(0, 0, 2.25, 4),
		},
		{
			// Having generated 3, it is one of the long ones: certain until 6.
			name: "conditioned on what it generated",
			it:   predict.Item{Generated: 3, Cap: 100, Seqs: 1, BlockTokens: 1, BlockBytes: 1, Lengths: l},
			mean: prefix(4, 5, 6),
		},
		{
			// Past everything ever observed: nothing known, held until its cap.
			name: "past every sample",
			it:   predict.Item{Generated: 7, Cap: 10, Seqs: 1, BlockTokens: 1, BlockBytes: 1, Lengths: l},
			mean: prefix(8, 9, 10),
		},
		{
			// Prompt 4 in blocks of 2: the 2 full blocks are shared and held while a
			// sequence may live; each of the 2 sequences holds (4+t+1)/2 − 2 blocks of
			// its own, rounded up, and is a Bernoulli from step 2.
			name:     "shared prompt, independent sequences",
			it:       predict.Item{Prompt: 4, Cap: 100, Seqs: 2, BlockTokens: 2, BlockBytes: 1, Lengths: l},
			mean:     prefix(2+2*1, 2+2*1, 2+2*0.5*2, 2+2*0.5*2, 2+2*0.5*3, 2+2*0.5*3),
			variance: prefix(0, 0, 2*0.25*4, 2*0.25*4, 2*0.25*9, 2*0.25*9),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mean, variance := curve(tc.it)
			sameCurve(t, "mean", mean, prefix(tc.mean...))
			sameCurve(t, "variance", variance, prefix(tc.variance...))
		})
	}
}

func TestAddToCensoredTail(t *testing.T) {
	// Half end at 2, half are cut by a cap at 4: the cut half is read as alive
	// up to this item's own cap.
	l := learn(t, predict.LengthsConfig{MaxLen: 1000}, sample{2, false}, sample{4, true})
	mean, variance := curve(predict.Item{Cap: 8, Seqs: 1, BlockTokens: 1, BlockBytes: 1, Lengths: l})
	sameCurve(t, "mean", mean, prefix(1, 2, 1.5, 2, 2.5, 3, 3.5, 4))
	sameCurve(t, "variance", variance, prefix(0, 0, 2.25, 4, 6.25, 9, 12.25, 16))
}

func TestAddToCoarseGridAndLongCaps(t *testing.T) {
	// Deterministic, blocks of 1: at index k the size is the one at step
	// t_{k+1} − 1, i.e. t_{k+1} tokens; the last index takes the cap.
	steps := predict.Steps()
	it := predict.Item{Cap: 3 * predict.MaxSteps, Seqs: 1, BlockTokens: 1, BlockBytes: 1}
	mean, _ := curve(it)
	for k := range predict.GridLen - 1 {
		if mean[k] != float64(steps[k+1]) {
			t.Fatalf("mean[%d] (steps %d–%d) = %v, want %d", k, steps[k], steps[k+1]-1, mean[k], steps[k+1])
		}
	}
	if last := mean[predict.GridLen-1]; last != float64(it.Final()) {
		t.Fatalf("last index = %v, want Final %d", last, it.Final())
	}
}

func TestSubFromUndoesAddTo(t *testing.T) {
	l := twoPoint(t)
	a := predict.Item{Prompt: 300, Generated: 1, Cap: 50, Seqs: 2, BlockTokens: 16, BlockBytes: 1 << 21, Lengths: l}
	b := predict.Item{Prompt: 17, Cap: 1000, Seqs: 1, BlockTokens: 16, BlockBytes: 1 << 21}
	mean, variance := curve(b)
	a.AddTo(mean, variance)
	a.SubFrom(mean, variance)
	wantMean, wantVar := curve(b)
	sameCurve(t, "mean", mean, wantMean)
	sameCurve(t, "variance", variance, wantVar)
}

func TestAddToPanicsOnShortCurve(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("AddTo on a curve shorter than GridLen did not panic")
		}
	}()
	predict.Item{Cap: 1, Seqs: 1, BlockTokens: 1, BlockBytes: 1}.AddTo(make([]float64, 3), make([]float64, 3))
}

func TestRemaining(t *testing.T) {
	l := twoPoint(t)
	censored := learn(t, predict.LengthsConfig{MaxLen: 1000}, sample{2, false}, sample{4, true})
	for _, tc := range []struct {
		name string
		it   predict.Item
		q    float64
		want int
	}{
		{"median of a fresh one", predict.Item{Cap: 100, Lengths: l}, 0.5, 2},
		{"high quantile", predict.Item{Cap: 100, Lengths: l}, 0.9, 6},
		{"conditioned", predict.Item{Generated: 3, Cap: 100, Lengths: l}, 0.5, 3},
		{"capped", predict.Item{Cap: 4, Lengths: l}, 0.9, 4},
		{"past every sample", predict.Item{Generated: 7, Cap: 100, Lengths: l}, 0.5, 93},
		{"censored tail unknown", predict.Item{Cap: 100, Lengths: censored}, 0.9, 100},
		{"censored tail known low", predict.Item{Cap: 100, Lengths: censored}, 0.5, 2},
		{"deterministic", predict.Item{Generated: 10, Cap: 100}, 0.5, 90},
		{"past its cap", predict.Item{Generated: 12, Cap: 10, Lengths: l}, 0.5, 0},
		{"invalid q", predict.Item{Cap: 100, Lengths: l}, 0, 100},
		{"NaN q", predict.Item{Cap: 100, Lengths: l}, math.NaN(), 100},
	} {
		if got := tc.it.Remaining(tc.q); got != tc.want {
			t.Errorf("%s: Remaining(%v) = %d, want %d", tc.name, tc.q, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	good := predict.Item{Prompt: 10, Cap: 5, Seqs: 1, BlockTokens: 16, BlockBytes: 1}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid item: %v", err)
	}
	bad := predict.Item{Prompt: -1, Generated: -1, Cap: -1, Seqs: 0, BlockTokens: 0, BlockBytes: 0, Lead: -1}
	err := bad.Validate()
	if err == nil {
		t.Fatal("invalid item accepted")
	}
	for _, field := range []string{"Prompt", "Generated", "Cap", "Seqs", "BlockTokens", "BlockBytes", "Lead"} {
		if !strings.Contains(err.Error(), "Item."+field+" ") {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
}

func TestSteps(t *testing.T) {
	s := predict.Steps()
	if len(s) != predict.GridLen || s[0] != 0 || s[len(s)-1] != predict.MaxSteps {
		t.Fatalf("grid of %d points from %d to %d; want %d from 0 to %d", len(s), s[0], s[len(s)-1], predict.GridLen, predict.MaxSteps)
	}
	for k := 1; k < len(s); k++ {
		if k < 16 && s[k] != k {
			t.Fatalf("step %d is %d: every step below 16 must be on the grid", k, s[k])
		}
		if r := float64(s[k]) / float64(s[k-1]); k > 16 && (r < 1.06 || r > 1.125) {
			t.Fatalf("steps %d → %d: ratio %.3f outside [1.06, 1.125]", s[k-1], s[k], r)
		}
	}
	s[3] = 99
	if predict.Steps()[3] != 3 {
		t.Fatal("Steps returned the grid itself, not a copy")
	}
}

// TestCurveInvariants checks, on random items, what every curve must
// satisfy: at step 0 the item holds Now, for sure; a learned curve is
// nowhere above the deterministic one; the deterministic curve peaks at
// Final (its worst case) and has no variance.
func TestCurveInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	l := learnChat(t, rng)
	for i := range 2000 {
		det := predict.Item{
			Prompt: rng.IntN(5000), Generated: rng.IntN(1100), Cap: rng.IntN(1100), Seqs: 1 + rng.IntN(4),
			BlockTokens: 1 + rng.IntN(32), BlockBytes: 1 + rng.Int64N(1<<21), Lead: rng.IntN(8),
		}
		learned := det
		learned.Lengths = l
		dm, dv := curve(det)
		lm, lv := curve(learned)
		if dm[0] != float64(det.Now()) || lm[0] != dm[0] || dv[0] != 0 || lv[0] != 0 {
			t.Fatalf("%d: %+v: step 0 holds %v / %v (variance %v / %v), want Now %d for sure", i, det, dm[0], lm[0], dv[0], lv[0], det.Now())
		}
		if det.Generated < det.Cap {
			if peak, _ := predict.Bound(dm, dv, 3); peak != float64(det.Final()) {
				t.Fatalf("%d: %+v: deterministic peak %v, want Final %d", i, det, peak, det.Final())
			}
		}
		for k := range dm {
			if dv[k] != 0 || lv[k] < 0 || lm[k] > dm[k]*(1+1e-12) {
				t.Fatalf("%d: %+v: at %d deterministic %v (variance %v), learned %v (variance %v)", i, det, k, dm[k], dv[k], lm[k], lv[k])
			}
		}
	}
}

func TestAddToDoesNotAllocate(t *testing.T) {
	it := predict.Item{Prompt: 300, Generated: 20, Cap: 1024, Seqs: 2, BlockTokens: 16, BlockBytes: 1 << 21, Lead: 2, Lengths: twoPoint(t)}
	mean, variance := make([]float64, predict.GridLen), make([]float64, predict.GridLen)
	if n := testing.AllocsPerRun(100, func() { it.AddTo(mean, variance); it.SubFrom(mean, variance) }); n != 0 {
		t.Fatalf("AddTo+SubFrom allocate %v times", n)
	}
}

// AddWithAllAlive is AddTo and, in hi, AddTo without Lengths, in one pass.
func TestAddWithAllAliveIsBothCurves(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	l := learnChat(t, rng)
	for i := range 500 {
		it := predict.Item{Prompt: rng.IntN(5000), Generated: rng.IntN(1100), Cap: 1 + rng.IntN(1200), Seqs: 1 + rng.IntN(3),
			BlockTokens: 16, BlockBytes: 1 << 17, Lead: rng.IntN(3), Lengths: l}
		if i%5 == 0 {
			it.Lengths = nil
		}
		wantM, wantV, wantH, scratch := make([]float64, predict.GridLen), make([]float64, predict.GridLen), make([]float64, predict.GridLen), make([]float64, predict.GridLen)
		it.AddTo(wantM, wantV)
		det := it
		det.Lengths = nil
		det.AddTo(wantH, scratch)
		m, v, h := make([]float64, predict.GridLen), make([]float64, predict.GridLen), make([]float64, predict.GridLen)
		points := it.AddWithAllAlive(m, v, h)
		if !reflect.DeepEqual(m, wantM) || !reflect.DeepEqual(v, wantV) || !reflect.DeepEqual(h, wantH) {
			t.Fatalf("item %+v: AddWithAllAlive differs from AddTo", it)
		}
		// The points it reports are where it ends: the all-alive curve is
		// held at every point before (it is alive there, whatever Lengths
		// says), and nothing is added from there on.
		if points < 1 || points > predict.GridLen {
			t.Fatalf("item %+v: %d points", it, points)
		}
		for k := range predict.GridLen {
			if touched := m[k] != 0 || v[k] != 0 || h[k] != 0; touched != (k < points) {
				t.Fatalf("item %+v: %d points reported, point %d touched %v", it, points, k, touched)
			}
		}
	}
}
