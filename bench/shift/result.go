package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// outcome is how one request ended.
type outcome int

const (
	ok       outcome = iota
	stopped          // the gateway stopped it (kv_guard_stopped)
	oom              // the backend failed it: out of memory
	shed             // 429
	canceled         // our own hang-up
	other
)

var outcomeNames = [...]string{"ok", "stopped", "oom", "shed", "canceled", "other"}

type record struct {
	start, end time.Duration
	tenant     string
	long       bool
	outcome    outcome
	tokens     int
	detail     string
	status     int           // the HTTP status (0: no answer)
	ttft       time.Duration // to the first token of a streamed answer
}

type sample struct {
	at         time.Duration
	kv         float64
	kvKnown    bool // kv was read (the last tick's scrape, cut by the run's end, is not)
	p90        int
	distrusted bool
	overcommit float64 // worst cases held / capacity
	trips      map[string]int64
	driftTrips map[string]int64 // the drift trips by what was distrusted (model, tenant, class)
}

type result struct {
	sc       *scenario
	records  []record
	samples  []sample
	overflow float64
	total    time.Duration
	shiftAt  time.Duration
	// changeAt is when the traffic starts to depart from its history:
	// requests sent from then on are the ones the stop bar counts.
	changeAt    time.Duration
	reservation string
	// guardStops is the streams the guard stopped, resumed of them the
	// ones the gateway sent again rather than cut.
	guardStops int64
	resumed    float64
	// preemptive is the requests admitted on room of lower classes.
	preemptive float64
	// The prompt tokens predicted and reported by tenant (promptCounts),
	// at calibratedAt (the change) and at the end: what the estimate
	// over-reserved once calibrated is their difference.
	calibratedAt          time.Duration
	promptsAt, promptsEnd map[string][2]float64
	// prompts were estimated, underCounted of them below the backend's
	// count; widened is the times that sent the estimate back to its bound.
	prompts, underCounted, widened float64
}

// overReserved is how far the gateway's prompt counts of tenant t were
// above the backend's, from from (nil: the start) to to.
func overReserved(from, to map[string][2]float64, t string) float64 {
	d := to[t]
	if from != nil {
		d[0] -= from[t][0]
		d[1] -= from[t][1]
	}
	if d[1] <= 0 {
		return math.NaN()
	}
	return d[0]/d[1] - 1
}

// window sums what answered requests generated between from and to
// (finished in it), per second.
func (r *result) goodput(from, to time.Duration) float64 {
	var t int
	for _, x := range r.records {
		if x.outcome == ok && x.end >= from && x.end < to {
			t += x.tokens
		}
	}
	return float64(t) / (to - from).Seconds()
}

func (r *result) kvMean(from, to time.Duration) float64 {
	var s float64
	n := 0
	for _, x := range r.samples {
		if x.kvKnown && x.at >= from && x.at < to {
			s += x.kv
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return s / float64(n)
}

// count is how many records match.
func (r *result) count(f func(record) bool) int {
	n := 0
	for _, x := range r.records {
		if f(x) {
			n++
		}
	}
	return n
}

// admittedAfter counts the requests sent from t on that got a backend's
// answer or were stopped (not shed, not our hang-ups).
func (r *result) admittedAfter(t time.Duration) int {
	return r.count(func(x record) bool { return x.start >= t && x.outcome != shed && x.outcome != canceled })
}

// p90At is the learned p90 the gateway showed at t (the last sample
// before it).
func (r *result) p90At(t time.Duration) int {
	p := 0
	for _, s := range r.samples {
		if s.at <= t {
			p = s.p90
		}
	}
	return p
}

// longP90 is the p90 of the answered long requests' lengths.
func (r *result) longP90() int {
	var n []int
	for _, x := range r.records {
		if x.long && x.outcome == ok {
			n = append(n, x.tokens)
		}
	}
	if len(n) == 0 {
		return 0
	}
	slices.Sort(n)
	return n[int(math.Ceil(0.9*float64(len(n))))-1]
}

func (r *result) print(w io.Writer) {
	fmt.Fprintf(w, "Scenario %s (reservation %s): %s\n", r.sc.name, r.reservation, r.sc.title)
	by := map[outcome]int{}
	for _, x := range r.records {
		by[x.outcome]++
	}
	var parts []string
	for i, n := range outcomeNames {
		parts = append(parts, fmt.Sprintf("%s %d", n, by[outcome(i)]))
	}
	fmt.Fprintf(w, "  requests: %s\n", strings.Join(parts, ", "))
	after := r.admittedAfter(r.changeAt)
	stoppedAfter := r.count(func(x record) bool { return x.start >= r.changeAt && x.outcome == stopped })
	fmt.Fprintf(w, "  overflow events %.0f; stopped by the gateway %d of %d admitted after the change (%.2f%%); the guard stopped %d streams, resumed %.0f; %.0f admitted preemptively\n",
		r.overflow, stoppedAfter, after, 100*float64(stoppedAfter)/math.Max(1, float64(after)), r.guardStops, r.resumed, r.preemptive)
	if r.sc.dense != nil {
		fmt.Fprintf(w, "  prompt tokens over-reserved (gateway's count ÷ backend's − 1): English %+.1f%% from the start, %+.1f%% after %s; dense %+.1f%%, %+.1f%%\n",
			100*overReserved(nil, r.promptsEnd, "en"), 100*overReserved(r.promptsAt, r.promptsEnd, "en"), r.calibratedAt.Round(time.Second),
			100*overReserved(nil, r.promptsEnd, "dense"), 100*overReserved(r.promptsAt, r.promptsEnd, "dense"))
		fmt.Fprintf(w, "  prompts estimated %.0f, below the backend's count %.0f; the estimate widened back to its bound %.0f times\n",
			r.prompts, r.underCounted, r.widened)
	} else if r.sc.tenantOf != nil && r.sc.maxTokens == nil {
		lostB := r.count(func(x record) bool { return x.tenant == "b" && (x.outcome == oom || x.outcome == stopped) })
		okB := r.count(func(x record) bool { return x.tenant == "b" && x.outcome == ok })
		fmt.Fprintf(w, "  tenant B: %d answered, %d lost (out of memory or stopped)\n", okB, lostB)
	}
	s := r.shiftAt
	fmt.Fprintf(w, "  goodput tok/s: before %.0f, first 30s after %.0f, 30–60s after %.0f; KV mean before %.1f%%, 30–60s after %.1f%%\n",
		r.goodput(s/3, s), r.goodput(s, s+30*time.Second), r.goodput(s+30*time.Second, s+60*time.Second),
		100*r.kvMean(s/3, s), 100*r.kvMean(s+30*time.Second, s+60*time.Second))
	fmt.Fprintf(w, "  learned p90: %d before, %d at +10s, %d at +30s; long answers' p90 %d\n",
		r.p90At(s-time.Second), r.p90At(s+10*time.Second), r.p90At(s+30*time.Second), r.longP90())
	var distrusted, before int
	var overcommit float64
	var trips, drift map[string]int64
	for _, x := range r.samples {
		if x.driftTrips != nil {
			drift = x.driftTrips
		}
		if x.at < s {
			before++
			overcommit += x.overcommit
			if x.distrusted {
				distrusted++
			}
		}
		if x.trips != nil {
			trips = x.trips
		}
	}
	fmt.Fprintf(w, "  before the change: distrusted %d of %d samples, worst cases held %.1f× the budget on average; forecast trips by the end %v, drift by scope %v\n",
		distrusted, before, overcommit/math.Max(1, float64(before)), trips, drift)
	shown := 0
	for _, x := range r.records {
		if x.outcome == other && shown < 3 {
			fmt.Fprintf(w, "  other: %s\n", x.detail)
			shown++
		}
	}
}

// lastTrips is the gateway's forecast trips by reason at the end of the run
// (nil when it was not read: the simulator alone).
func (r *result) lastTrips() map[string]int64 {
	var trips map[string]int64
	for _, x := range r.samples {
		if x.trips != nil {
			trips = x.trips
		}
	}
	return trips
}

// ttftP99 is the 99th percentile of the time to first token of tenant's
// answered requests sent from from on.
func (r *result) ttftP99(tenant string, from time.Duration) time.Duration {
	var d []time.Duration
	for _, x := range r.records {
		if x.tenant == tenant && x.outcome == ok && x.start >= from && x.ttft > 0 {
			d = append(d, x.ttft)
		}
	}
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, len(d)*99/100)]
}

// non200 counts the answers that were not a 200, or no answer at all.
func (r *result) non200() int {
	return r.count(func(x record) bool { return x.outcome != canceled && x.status != 200 })
}

// twoTenantChecks compares the two-tenant scenario through the gateway with
// the same traffic to the simulator alone, over the time both tenants send.
func twoTenantChecks(w io.Writer, gw, direct *result) {
	from, to := gw.shiftAt, gw.total
	g, d := gw.goodput(from, to), direct.goodput(from, to)
	tg, td := gw.ttftP99("interactive", from), direct.ttftP99("interactive", from)
	trips := gw.lastTrips()
	fmt.Fprintf(w, "two-tenant: goodput %.0f tok/s through the gateway, %.0f alone (%.2f×); interactive p99 TTFT %.3fs vs %.3fs (%.2f×); KV mean %.1f%% vs %.1f%%; forecast trips %v; non-200 answers %d (gateway), %d (alone)\n",
		g, d, g/math.Max(d, 1), tg.Seconds(), td.Seconds(), tg.Seconds()/math.Max(td.Seconds(), 1e-9), 100*gw.kvMean(from, to), 100*direct.kvMean(from, to), trips, gw.non200(), direct.non200())
}
