package admission

import (
	"math"
	"math/bits"
	"time"
)

// drainBuckets is how many slices the drain window is cut into. The estimate
// forgets a release at most one slice later than the window says.
const drainBuckets = 10

// drainEstimator measures the rate at which held weight is given back
// (Release and Shrink), over a sliding window of drainBuckets buckets. It
// has no lock of its own: Budget.mu guards it.
//
// Releases are stamped lazily, to keep the clock off the Release path (a
// clock reading costs more than the rest of an Acquire+Release): the first
// release after the estimator was last read notes the time, later ones only
// add to pending, and the next read spreads the pending weight evenly over
// the time from that first release to the read. A read costs nothing extra
// when releases were already read one by one.
type drainEstimator struct {
	base  time.Time     // bucket k covers [base+k·width, base+(k+1)·width)
	width time.Duration // window / drainBuckets
	epoch [drainBuckets]int64
	bytes [drainBuckets]int64

	pending      int64     // released since the last read, not yet in a bucket
	pendingSince time.Time // when the first of them was released
}

// add notes a release of n; the clock is read only for the first release
// of a run.
func (d *drainEstimator) add(n int64, clock Clock) {
	if d.pending == 0 {
		d.pendingSince = clock.Now()
	}
	d.pending += n
}

// flush moves the pending run into the buckets, spread evenly over
// [pendingSince, now]: bucket k gets the part of the run's weight that its
// overlap with that interval is of the interval, by exact integer shares.
func (d *drainEstimator) flush(now time.Time) {
	if d.pending == 0 {
		return
	}
	n := d.pending
	d.pending = 0
	from, to := d.pendingSince.Sub(d.base), now.Sub(d.base)
	if from < 0 {
		from = 0
	}
	if to <= from {
		d.record(now, n)
		return
	}
	length := to - from
	upTo := func(t time.Duration) int64 { // floor(n × (t − from) / length)
		hi, lo := bits.Mul64(uint64(n), uint64(t-from))
		q, _ := bits.Div64(hi, lo, uint64(length))
		return int64(q)
	}
	kFrom, kTo := int64(from/d.width), int64(to/d.width)
	kFrom = max(kFrom, kTo-drainBuckets+1) // older parts have left the window
	for k := kFrom; k <= kTo; k++ {
		start := max(from, time.Duration(k)*d.width)
		end := min(to, time.Duration(k+1)*d.width)
		if share := upTo(end) - upTo(start); share > 0 {
			d.addToBucket(k, share)
		}
	}
}

func newDrainEstimator(now time.Time, window time.Duration) drainEstimator {
	d := drainEstimator{base: now, width: window / drainBuckets}
	for i := range d.epoch {
		d.epoch[i] = -1
	}
	return d
}

func (d *drainEstimator) bucket(now time.Time) (k int64, elapsed time.Duration) {
	elapsed = now.Sub(d.base)
	if elapsed < 0 {
		elapsed = 0
	}
	return int64(elapsed / d.width), elapsed
}

// record puts n released at now into its bucket.
func (d *drainEstimator) record(now time.Time, n int64) {
	k, _ := d.bucket(now)
	d.addToBucket(k, n)
}

func (d *drainEstimator) addToBucket(k, n int64) {
	slot := k % drainBuckets
	if d.epoch[slot] != k {
		d.epoch[slot], d.bytes[slot] = k, 0
	}
	d.bytes[slot] += n
}

// sample is the weight released in the window ending now and the span it
// was measured over: from the start of the oldest bucket still in the window
// (or from the estimator's start, if later) to now, but never less than one
// bucket so that the first release does not read as an infinite rate.
// total == 0 means there is no measurement.
func (d *drainEstimator) sample(now time.Time) (total int64, span time.Duration) {
	d.flush(now)
	k, elapsed := d.bucket(now)
	for i, e := range d.epoch {
		if e > k-drainBuckets && e <= k {
			total += d.bytes[i]
		}
	}
	start := time.Duration(k-drainBuckets+1) * d.width
	if start < 0 {
		start = 0
	}
	span = max(elapsed-start, d.width)
	return total, span
}

// rate is the measured release rate in weight units per second, 0 if unknown.
func (d *drainEstimator) rate(now time.Time) float64 {
	total, span := d.sample(now)
	if total == 0 {
		return 0
	}
	return float64(total) / span.Seconds()
}

// wait is the time to release need more weight at the measured rate,
// need × span / total, rounded up to the nanosecond; ok is false when there
// is no measurement. It is exact integer arithmetic, so tests can state
// exact values.
func (d *drainEstimator) wait(now time.Time, need int64) (w time.Duration, ok bool) {
	total, span := d.sample(now)
	if total == 0 {
		return 0, false
	}
	if need <= 0 {
		return 0, true
	}
	hi, lo := bits.Mul64(uint64(need), uint64(span))
	if hi >= uint64(total) {
		return math.MaxInt64, true
	}
	q, r := bits.Div64(hi, lo, uint64(total))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64, true
	}
	return time.Duration(q), true
}

// needLocked is how much held weight must drain before a request of weight
// w can be admitted, with `ahead` weight queued before it (tAhead of it its
// tenant's): what it and those ahead lack of the free capacity, or of its
// tenant's cap, whichever is more.
func (b *Budget) needLocked(ahead int64, t *tenantState, tAhead, w int64) int64 {
	need := ahead + w - (b.effective - b.held)
	if tn := t.held + tAhead + w - t.cap; tn > need {
		need = tn
	}
	return need
}

// retryLocked is the RetryAfter of a refusal whose request lacks need.
func (b *Budget) retryLocked(now time.Time, need int64) time.Duration {
	return b.clampRetryLocked(b.drain.wait(now, need))
}

// clampRetryLocked turns a wait estimate into a RetryAfter in
// [MinRetryAfter, MaxRetryAfter]. With no measurement it is the drain
// window: nothing has drained for that long, so waiting less is a guess.
func (b *Budget) clampRetryLocked(est time.Duration, known bool) time.Duration {
	if !known {
		est = b.set.drainWindow
	}
	return min(max(est, MinRetryAfter), b.set.maxRetryAfter)
}
