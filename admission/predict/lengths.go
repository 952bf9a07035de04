package predict

import (
	"fmt"
	"math/bits"
)

// The histogram's layout: every length below fineLen has a bucket of its
// own; above, each octave [2^e, 2^(e+1)) is cut into perOctave buckets of
// equal width, so no bucket is wider than 1/16 of the lengths it holds.
const (
	fineBits  = 5
	fineLen   = 1 << fineBits
	subBits   = 4
	perOctave = 1 << subBits
)

// layoutVersion names the bucket scheme in a Snapshot's layout id: two
// replicas whose ids differ cannot add their counts.
const layoutVersion = "loglin1"

// DefaultWindow is the number of samples a Lengths remembers at full weight
// when LengthsConfig.Window is zero.
const DefaultWindow = 2000

// minCount is the weight below which a decayed bucket count is dropped:
// ten halvings, so an old sample is forgotten entirely, not kept forever as a
// vanishing weight that still decides the tail on its own.
const minCount = 1.0 / 1024

// bucketOf is the bucket that holds length x >= 0.
func bucketOf(x int) int {
	if x < fineLen {
		return x
	}
	e := bits.Len(uint(x)) - 1
	return fineLen + (e-fineBits)*perOctave + (x>>(e-subBits))&(perOctave-1)
}

// bucketLow is the smallest length in bucket b.
func bucketLow(b int) int {
	if b < fineLen {
		return b
	}
	e := (b-fineLen)/perOctave + fineBits
	s := (b - fineLen) % perOctave
	return (perOctave + s) << (e - subBits)
}

// LengthsConfig configures a Lengths.
type LengthsConfig struct {
	// MaxLen is the largest output length tracked, in tokens (e.g. the
	// model's max_model_len); > 0. A longer observation counts as stopped by
	// a cap at MaxLen: it says only that L >= MaxLen.
	MaxLen int
	// Window is how many samples count at full weight; 0 means
	// DefaultWindow. Once the decayed total passes 2×Window every count is
	// halved, so the learned distribution follows a shifting workload with a
	// memory of about Window to 2×Window recent samples.
	Window int
}

// Lengths learns the distribution of output lengths L (tokens per sequence)
// of one model, or of one tenant of a model. Right-censored samples are first
// class: a sequence stopped by its max_tokens cap (finish_reason "length")
// says only L >= n. The survival function is the Kaplan–Meier estimate over a
// log-linear histogram (a bucket per length below 32, 16 per octave above,
// up to MaxLen).
//
// Not safe for concurrent use: the caller locks. Only Observe and Merge
// write; every other method (and Item's methods reading this Lengths) only
// reads, so a sync.RWMutex read lock is enough for them.
type Lengths struct {
	maxLen int
	window float64
	total  float64   // Σ ended + Σ capped: the effective number of samples
	ended  []float64 // per bucket: decayed count of sequences that stopped on their own
	capped []float64 // per bucket: decayed count of sequences stopped by a cap
	last   []int     // last[b] is the largest length bucket b holds
	top    int       // the highest bucket with a count; -1 when there is none
	// surv[b] = P(L > last[b]) for b <= top, recomputed by every write so
	// that reads are pure lookups; entries above top are stale, never read.
	surv []float64
}

// NewLengths returns an empty Lengths. Until it has samples its Survival is
// 1 everywhere and its Quantile unknown: an item that uses it is held until
// its cap, as a worst case.
func NewLengths(cfg LengthsConfig) (*Lengths, error) {
	if cfg.MaxLen <= 0 {
		return nil, fmt.Errorf("predict: LengthsConfig.MaxLen is %d; it must be > 0 (the largest output length tracked, e.g. max_model_len)", cfg.MaxLen)
	}
	if cfg.Window < 0 {
		return nil, fmt.Errorf("predict: LengthsConfig.Window is %d; it must be >= 0 (0 means %d samples)", cfg.Window, DefaultWindow)
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	nb := bucketOf(cfg.MaxLen) + 1
	l := &Lengths{
		maxLen: cfg.MaxLen,
		window: float64(cfg.Window),
		ended:  make([]float64, nb),
		capped: make([]float64, nb),
		last:   make([]int, nb),
		surv:   make([]float64, nb),
		top:    -1,
	}
	for b := range l.last {
		l.last[b] = min(bucketLow(b+1)-1, l.maxLen)
	}
	l.recompute()
	return l, nil
}

// MaxLen is the largest length tracked.
func (l *Lengths) MaxLen() int { return l.maxLen }

// Observe adds one finished sequence that generated n tokens; capped says it
// was stopped by its max_tokens cap (finish_reason "length"), so that its
// natural length is only known to be at least n. A negative n is ignored.
func (l *Lengths) Observe(n int, capped bool) {
	if n < 0 {
		return
	}
	if n > l.maxLen {
		n, capped = l.maxLen, true
	}
	b := bucketOf(n)
	l.top = max(l.top, b)
	if capped {
		l.capped[b]++
	} else {
		l.ended[b]++
	}
	l.total++
	l.decay()
	l.recompute()
}

// Samples is the effective (decayed) number of samples.
func (l *Lengths) Samples() float64 { return l.total }

// Survival is P(L > x) by Kaplan–Meier: 1 at x < 0 and while there are no
// samples, non-increasing in x. It is exact at every length below 32 and at
// the last length of each wider bucket; inside a bucket it keeps the value
// the bucket starts with, which is never below what the same samples at their
// exact lengths would give (the estimate errs towards longer outputs). Past
// MaxLen it stays at Survival(MaxLen): what happens there is not tracked.
func (l *Lengths) Survival(x int) float64 {
	if x < 0 || l.top < 0 {
		return 1
	}
	b := bucketOf(min(x, l.maxLen))
	switch {
	case b > l.top: // past every sample: the estimate stays where it ends
		return l.surv[l.top]
	case x >= l.last[b]:
		return l.surv[b]
	default: // x is inside a wide bucket, so b >= fineLen > 0
		return l.surv[b-1]
	}
}

// Quantile is the smallest length x with P(L <= x) >= q, for q in (0, 1].
// ok is false when there are no samples, when q is outside (0, 1], and when
// the censored tail leaves the answer unknown (too many sequences were cut
// by their caps to know where the q-th fraction would have stopped); the
// caller then falls back on its cap. x is the last length of its bucket, so
// it errs towards longer outputs by less than 1/16.
func (l *Lengths) Quantile(q float64) (n int, ok bool) {
	if !(q > 0 && q <= 1) || l.top < 0 {
		return 0, false
	}
	return l.firstAtMost(0, 1-q)
}

// firstAtMost is the smallest bucket-last length x >= from with
// Survival(x) <= s, if there is one.
func (l *Lengths) firstAtMost(from int, s float64) (int, bool) {
	for b := bucketOf(min(from, l.maxLen)); b <= l.top; b++ {
		if l.surv[b] <= s*(1+survivalSlack) {
			return l.last[b], true
		}
	}
	return 0, false
}

// survivalSlack is the relative rounding of the Kaplan–Meier product that a
// comparison forgives, so that (for instance) the median of ten uncensored
// samples is the fifth, not the sixth, when 0.9 × (8/9) × … comes out a hair
// above 0.5.
const survivalSlack = 1e-12

// decay halves every count while the total is past 2×Window, and drops the
// counts that have faded below minCount.
func (l *Lengths) decay() {
	for l.total > 2*l.window {
		l.total, l.top = 0, -1
		for b := range l.ended {
			l.ended[b] = halve(l.ended[b])
			l.capped[b] = halve(l.capped[b])
			if c := l.ended[b] + l.capped[b]; c > 0 {
				l.total += c
				l.top = b
			}
		}
	}
}

func halve(c float64) float64 {
	if c /= 2; c < minCount {
		return 0
	}
	return c
}

// recompute refreshes surv from the counts: the Kaplan–Meier product over
// buckets of (1 − ended_b / at risk_b), where the sequences at risk at bucket
// b are all those observed at b or later. A bucket's censored samples count
// as at risk for its own events (censored after the events of the same
// bucket), which again errs towards longer outputs. Only buckets up to top
// are written: Survival reads nothing above it.
func (l *Lengths) recompute() {
	surv := l.surv[:l.top+1]
	var atRisk float64
	for b := len(surv) - 1; b >= 0; b-- { // suffix sums, summed afresh so no rounding drifts
		atRisk += l.ended[b] + l.capped[b]
		surv[b] = atRisk
	}
	s := 1.0
	for b, r := range surv {
		switch e := l.ended[b]; {
		case e == 0:
		case e >= r:
			s = 0
		default:
			s *= 1 - e/r
		}
		surv[b] = s
	}
}

// MeanExcess is E[(min(L, to) − from)⁺]: how many tokens past from a
// sequence is expected to generate when its cap is to — the sum of
// Survival(x) over from <= x < to. It reads each bucket once, so its cost
// is the histogram's size, not to − from.
func (l *Lengths) MeanExcess(from, to int) float64 {
	from = max(from, 0)
	var sum float64
	for x := from; x < to; {
		b := bucketOf(min(x, l.maxLen))
		switch {
		case l.top < 0 || b > l.top || x >= l.maxLen: // flat from here on
			return sum + float64(to-x)*l.Survival(x)
		case x < l.last[b]: // inside a wide bucket: its value is the one it starts with
			n := min(l.last[b], to) - x
			sum += float64(n) * l.Survival(x)
			x += n
		default: // the bucket's last length
			sum += l.surv[b]
			x++
		}
	}
	return sum
}
