package predict_test

import (
	"math"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/admission/predict"
)

type sample struct {
	n      int
	capped bool
}

func learn(t testing.TB, cfg predict.LengthsConfig, samples ...sample) *predict.Lengths {
	t.Helper()
	l, err := predict.NewLengths(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		l.Observe(s.n, s.capped)
	}
	return l
}

func ended(ns ...int) []sample {
	s := make([]sample, len(ns))
	for i, n := range ns {
		s[i] = sample{n: n}
	}
	return s
}

const tol = 1e-12

func TestSurvivalKaplanMeier(t *testing.T) {
	for _, tc := range []struct {
		name    string
		maxLen  int
		samples []sample
		want    map[int]float64 // x -> P(L > x)
	}{
		{
			name:   "no samples: nothing ends",
			maxLen: 100,
			want:   map[int]float64{-1: 1, 0: 1, 50: 1, 100: 1, 1000: 1},
		},
		{
			name:    "uncensored: the empirical survival",
			maxLen:  100,
			samples: ended(1, 2, 3, 4),
			want:    map[int]float64{-5: 1, 0: 1, 1: 0.75, 2: 0.5, 3: 0.25, 4: 0, 99: 0, 500: 0},
		},
		{
			name:    "uncensored with ties and a zero length",
			maxLen:  100,
			samples: ended(0, 5, 5, 5),
			want:    map[int]float64{-1: 1, 0: 0.75, 4: 0.75, 5: 0},
		},
		{
			// The textbook case: at 3, 1 of 6 at risk ends; the censored 5 leaves; at 6,
			// 1 of 4 at risk (6, 6+, 8, 10+) ends, the censored 6 being at risk there; at
			// 8, 1 of 2. The censored 10 keeps the tail open.
			name:    "censored",
			maxLen:  100,
			samples: []sample{{3, false}, {5, true}, {6, false}, {6, true}, {8, false}, {10, true}},
			want: map[int]float64{
				2: 1, 3: 5.0 / 6, 5: 5.0 / 6, 6: 5.0 / 8, 7: 5.0 / 8,
				8: 5.0 / 16, 10: 5.0 / 16, 100: 5.0 / 16, 1 << 30: 5.0 / 16,
			},
		},
		{
			name:    "all censored: nothing known to end",
			maxLen:  100,
			samples: []sample{{3, true}, {7, true}},
			want:    map[int]float64{0: 1, 3: 1, 10: 1},
		},
		{
			// 32 and 33 share the bucket [32, 33], 40 is alone in [40, 41]: inside a
			// bucket the survival keeps its starting value (never below the exact one).
			name:    "wide buckets err towards longer",
			maxLen:  1000,
			samples: ended(32, 33, 40),
			want:    map[int]float64{31: 1, 32: 1, 33: 1.0 / 3, 39: 1.0 / 3, 40: 1.0 / 3, 41: 0},
		},
		{
			// 150 is past MaxLen: it counts as stopped by a cap at 20, at risk with the
			// uncensored 20.
			name:    "MaxLen clamp",
			maxLen:  20,
			samples: []sample{{5, false}, {150, false}, {20, false}},
			want:    map[int]float64{4: 1, 5: 2.0 / 3, 19: 2.0 / 3, 20: 1.0 / 3, 21: 1.0 / 3, 1000: 1.0 / 3},
		},
		{
			// MaxLen 50 cuts the bucket [50, 51] short: 50 is its last length.
			name:    "MaxLen inside a wide bucket",
			maxLen:  50,
			samples: []sample{{10, false}, {50, false}, {51, false}},
			want:    map[int]float64{9: 1, 10: 2.0 / 3, 49: 2.0 / 3, 50: 1.0 / 3, 51: 1.0 / 3},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := learn(t, predict.LengthsConfig{MaxLen: tc.maxLen}, tc.samples...)
			if got := l.Samples(); got != float64(len(tc.samples)) {
				t.Errorf("Samples = %v, want %d", got, len(tc.samples))
			}
			for x, want := range tc.want {
				if got := l.Survival(x); math.Abs(got-want) > tol {
					t.Errorf("Survival(%d) = %v, want %v", x, got, want)
				}
			}
			prev := 1.0
			for x := -2; x <= tc.maxLen+40; x++ {
				s := l.Survival(x)
				if s > prev || s < 0 {
					t.Fatalf("Survival(%d) = %v after %v: not non-increasing in [0, 1]", x, s, prev)
				}
				prev = s
			}
		})
	}
}

func TestQuantile(t *testing.T) {
	type want struct {
		n  int
		ok bool
	}
	censored := []sample{{3, false}, {5, true}, {6, false}, {6, true}, {8, false}, {10, true}}
	for _, tc := range []struct {
		name    string
		samples []sample
		q       map[float64]want
	}{
		{"no samples", nil, map[float64]want{0.5: {0, false}}},
		{"uncensored", ended(1, 2, 3, 4), map[float64]want{
			0.1: {1, true}, 0.25: {1, true}, 0.5: {2, true}, 0.74: {3, true}, 0.76: {4, true}, 1: {4, true},
			0: {0, false}, -1: {0, false}, 1.5: {0, false}, math.NaN(): {0, false},
		}},
		// 0.9·(8/9)·(7/8)·(6/7)·(5/6) is 0.5 only up to rounding: the median is 5.
		{"ten uncensored", ended(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), map[float64]want{0.5: {5, true}, 0.9: {9, true}}},
		{"censored tail", censored, map[float64]want{
			1.0 / 6: {3, true}, 0.3: {6, true}, 0.5: {8, true}, 11.0 / 16: {8, true},
			0.7: {0, false}, 1: {0, false},
		}},
		// A quantile in a wide bucket is the bucket's last length.
		{"wide bucket", ended(64, 64, 64, 64), map[float64]want{0.5: {67, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := learn(t, predict.LengthsConfig{MaxLen: 1000}, tc.samples...)
			for q, w := range tc.q {
				if n, ok := l.Quantile(q); n != w.n || ok != w.ok {
					t.Errorf("Quantile(%v) = %d, %v; want %d, %v", q, n, ok, w.n, w.ok)
				}
			}
		})
	}
}

func TestDecay(t *testing.T) {
	// Window 2: counts halve once the total passes 4.
	l := learn(t, predict.LengthsConfig{MaxLen: 100, Window: 2}, ended(1, 1, 1, 1)...)
	if got := l.Samples(); got != 4 {
		t.Fatalf("Samples = %v, want 4 (not yet past 2×Window)", got)
	}
	l.Observe(3, false) // total 5 > 4: 1 → 2, 3 → 0.5
	if got := l.Samples(); got != 2.5 {
		t.Fatalf("Samples after the fifth = %v, want 2.5", got)
	}
	if got, want := l.Survival(1), 0.5/2.5; math.Abs(got-want) > tol {
		t.Fatalf("Survival(1) = %v, want %v", got, want)
	}
}

func TestDecayFollowsAShift(t *testing.T) {
	l := learn(t, predict.LengthsConfig{MaxLen: 1000, Window: 100})
	for range 1000 {
		l.Observe(10, false)
	}
	if n, _ := l.Quantile(0.5); n != 10 {
		t.Fatalf("median %d, want 10", n)
	}
	for range 150 {
		l.Observe(50, false)
	}
	if n, _ := l.Quantile(0.5); n != 51 { // 50 is in the bucket [50, 51]
		t.Fatalf("median after the shift %d, want 51", n)
	}
	if s := l.Samples(); s < 100 || s > 200 {
		t.Fatalf("Samples = %v, want within [Window, 2×Window]", s)
	}
	if n, _ := l.Quantile(0.01); n != 10 {
		t.Fatalf("1st percentile %d, want 10: old samples fade, not vanish, after one window", n)
	}
	for range 3000 {
		l.Observe(50, false)
	}
	if n, _ := l.Quantile(0.001); n != 51 {
		t.Fatalf("0.1th percentile %d, want 51: faded samples must be forgotten", n)
	}
}

func TestNewLengthsRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg   predict.LengthsConfig
		field string
	}{
		{predict.LengthsConfig{MaxLen: 0}, "MaxLen"},
		{predict.LengthsConfig{MaxLen: -5}, "MaxLen"},
		{predict.LengthsConfig{MaxLen: 10, Window: -1}, "Window"},
	} {
		l, err := predict.NewLengths(tc.cfg)
		if err == nil || l != nil || !strings.Contains(err.Error(), "LengthsConfig."+tc.field) {
			t.Errorf("NewLengths(%+v) = %v, %v; want an error naming %s", tc.cfg, l, err, tc.field)
		}
	}
}

func TestObserveIgnoresNegative(t *testing.T) {
	l := learn(t, predict.LengthsConfig{MaxLen: 10}, sample{n: -1})
	if l.Samples() != 0 || l.Survival(0) != 1 {
		t.Fatalf("a negative length was counted: Samples %v, Survival(0) %v", l.Samples(), l.Survival(0))
	}
}

// MeanExcess is the sum of Survival over [from, to), read a bucket at a
// time: checked against the sum itself on fine and wide buckets, past the
// samples, past MaxLen and with no samples.
func TestMeanExcess(t *testing.T) {
	var samples []sample
	for i := range 300 {
		samples = append(samples, sample{n: 1 + (i*37)%700, capped: i%11 == 0})
	}
	for _, tc := range []struct {
		name string
		l    *predict.Lengths
	}{
		{"learned", learn(t, predict.LengthsConfig{MaxLen: 900}, samples...)},
		{"empty", learn(t, predict.LengthsConfig{MaxLen: 900})},
	} {
		for _, r := range [][2]int{{0, 10}, {0, 1024}, {17, 18}, {40, 700}, {129, 131}, {500, 2000}, {650, 1200}, {900, 950}, {30, 20}, {-5, 3}} {
			want := 0.0
			for x := max(r[0], 0); x < r[1]; x++ {
				want += tc.l.Survival(x)
			}
			if got := tc.l.MeanExcess(r[0], r[1]); math.Abs(got-want) > 1e-9*max(1, want) {
				t.Errorf("%s: MeanExcess(%d, %d) = %v, want %v", tc.name, r[0], r[1], got, want)
			}
		}
	}
}
