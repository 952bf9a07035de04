package admission

import (
	"math/bits"
	"time"
)

// drainBuckets is how many slices the drain window is cut into. The estimate
// forgets a release at most one slice later than the window says.
const drainBuckets = 10

// minDrainReleases is how many releases the window must hold before the
// rate is trusted: fewer, and a refusal cannot be told apart from a cold
// start, so nobody is shed early on it.
const minDrainReleases = 8

// drainEstimator measures the rate at which a GPU gives back charge
// (releases, and sequences that finish), over a sliding window of
// drainBuckets buckets, per second of *busy* time: time during which the
// GPU held at least one ticket. Idle time is not a slow drain, so a burst
// after a quiet spell is estimated from how fast the burst itself drains.
// It has no lock of its own: Scheduler.mu guards it.
//
// Releases are stamped lazily, to keep the clock off the Release path: the
// first release after the estimator was last read notes the time, later
// ones only add to pending, and the next read spreads the pending charge
// evenly over the time from that first release to the read.
type drainEstimator struct {
	base  time.Time     // bucket k covers [base+k·width, base+(k+1)·width)
	width time.Duration // window / drainBuckets
	epoch [drainBuckets]int64
	bytes [drainBuckets]int64
	count [drainBuckets]int
	busyD [drainBuckets]time.Duration

	pending      int64     // released since the last read, not yet in a bucket
	pendingN     int       // releases in pending
	pendingSince time.Time // when the first of them was released

	busySince time.Time // zero while the GPU is idle
}

func newDrainEstimator(now time.Time, window time.Duration) drainEstimator {
	d := drainEstimator{base: now, width: window / drainBuckets}
	for i := range d.epoch {
		d.epoch[i] = -1
	}
	return d
}

// add notes a release of n; the clock is read only for the first release
// of a run.
func (d *drainEstimator) add(n int64, clock Clock) {
	if n <= 0 {
		return
	}
	if d.pendingN == 0 {
		d.pendingSince = clock.Now()
	}
	d.pending += n
	d.pendingN++
}

// busy notes that the GPU became busy (on) or idle at now.
func (d *drainEstimator) busy(now time.Time, on bool) {
	switch {
	case on && d.busySince.IsZero():
		d.busySince = now
	case !on && !d.busySince.IsZero():
		d.spread(d.busySince, now, func(k int64, from, to time.Duration) {
			d.busyD[d.slot(k)] += to - from
		})
		d.busySince = time.Time{}
	}
}

// slot is bucket k's slot, cleared if it last held an older bucket.
func (d *drainEstimator) slot(k int64) int {
	i := int(k % drainBuckets)
	if d.epoch[i] != k {
		d.epoch[i], d.bytes[i], d.count[i], d.busyD[i] = k, 0, 0, 0
	}
	return i
}

// spread calls f for every bucket that [from, to) overlaps and that is
// still in the window ending at to, with the overlap as offsets from base.
func (d *drainEstimator) spread(from, to time.Time, f func(k int64, from, to time.Duration)) {
	a, b := from.Sub(d.base), to.Sub(d.base)
	if a < 0 {
		a = 0
	}
	if b <= a {
		return
	}
	kFrom, kTo := int64(a/d.width), int64(b/d.width)
	kFrom = max(kFrom, kTo-drainBuckets+1)
	for k := kFrom; k <= kTo; k++ {
		start := max(a, time.Duration(k)*d.width)
		end := min(b, time.Duration(k+1)*d.width)
		if end > start {
			f(k, start, end)
		}
	}
}

// flush moves the pending run into the buckets, spread evenly over
// [pendingSince, now] by exact integer shares; its count goes to now's
// bucket.
func (d *drainEstimator) flush(now time.Time) {
	if d.pendingN == 0 {
		return
	}
	n, c := d.pending, d.pendingN
	d.pending, d.pendingN = 0, 0
	k, _ := d.bucket(now)
	d.count[d.slot(k)] += c
	from, to := d.pendingSince.Sub(d.base), now.Sub(d.base)
	if from < 0 {
		from = 0
	}
	if to <= from {
		d.bytes[d.slot(k)] += n
		return
	}
	length := to - from
	upTo := func(t time.Duration) int64 { // floor(n × (t − from) / length)
		hi, lo := bits.Mul64(uint64(n), uint64(t-from))
		q, _ := bits.Div64(hi, lo, uint64(length))
		return int64(q)
	}
	d.spread(d.pendingSince, now, func(k int64, start, end time.Duration) {
		if share := upTo(end) - upTo(start); share > 0 {
			d.bytes[d.slot(k)] += share
		}
	})
}

func (d *drainEstimator) bucket(now time.Time) (k int64, elapsed time.Duration) {
	elapsed = now.Sub(d.base)
	if elapsed < 0 {
		elapsed = 0
	}
	return int64(elapsed / d.width), elapsed
}

// sample is what the window ending now holds: the charge released, the
// number of releases, and the busy time they were released over (the
// current busy spell included).
func (d *drainEstimator) sample(now time.Time) (total int64, releases int, busy time.Duration) {
	d.flush(now)
	k, elapsed := d.bucket(now)
	for i, e := range d.epoch {
		if e > k-drainBuckets && e <= k {
			total += d.bytes[i]
			releases += d.count[i]
			busy += d.busyD[i]
		}
	}
	if !d.busySince.IsZero() {
		start := max(time.Duration(k-drainBuckets+1)*d.width, 0)
		if from := max(d.busySince.Sub(d.base), start); elapsed > from {
			busy += elapsed - from
		}
	}
	return total, releases, busy
}

// rate is the measured release rate in charge per busy second, and the
// number of releases it rests on. A busy time shorter than a hundredth of
// the window counts as that, so that the first releases of a spell do not
// read as an infinite rate.
func (d *drainEstimator) rate(now time.Time) (float64, int) {
	total, n, busy := d.sample(now)
	if total == 0 {
		return 0, n
	}
	busy = max(busy, d.width/drainBuckets)
	return float64(total) / busy.Seconds(), n
}
