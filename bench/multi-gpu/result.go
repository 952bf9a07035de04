package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// result is one configuration's figures.
type result struct {
	setup
	clients int
	load    string        // the machine's load average as the run ended (Linux)
	step    benchkit.Step // kvgate loadtest's, over its whole step
	poolFit float64       // requests a pool holds at their worst case, on average

	// From the samples.
	window      [2]time.Duration // the saturated window (after the kill in (c))
	goodput     float64          // answered output tokens/s over window
	kvMean      float64          // KV use of the live simulators over window
	kvPeak      float64          // the highest any simulator reached
	overflow    float64          // out-of-memory events, every simulator
	killedAt    time.Duration    // (c): since the load started
	noticed     time.Duration    // (c): kill to the gateway taking the backend out of routing
	boundAround float64          // (c): admissions to the dead GPU from the kill to a second after it left routing
	boundAfter  float64          // (c): admissions to it later than that

	// From the gateway's /metrics at the end, and its log.
	queueTimeouts float64
	noBackend     float64 // 503 no_healthy_backend
	noRouteWaits  float64 // waiters refused with no_route
	noRouteSlow   float64 // of them, after more than a second
	moved         int     // requests moved to another GPU before their first byte
	lostMidStream float64 // streams cut by the dead backend
}

// read turns the samples and the gateway's final metrics into r's figures.
func (r *result) read(s *sampler, end benchkit.Metrics) error {
	// The saturated span: every client has a request in flight (queued or
	// running) — before the last requests are sent, after the first ones.
	first, last := -1, -1
	for i, sm := range s.samples {
		if sm.inflight >= 0.95*float64(r.clients) {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 || last-first < 8 {
		return fmt.Errorf("never saturated: fewer than 2 s with all %d clients in flight (more --requests?)", r.clients)
	}
	t0, t1 := s.samples[first].at, s.samples[last].at
	from, to := t0+(t1-t0)/5, t0+(t1-t0)*4/5
	if r.kill {
		r.killedAt = s.killed
		if s.killed >= to {
			return fmt.Errorf("the kill at %.1f s came after the saturated window ended at %.1f s (lower --kill-at)", s.killed.Seconds(), to.Seconds())
		}
		from = s.killed
	}
	r.window = [2]time.Duration{from, to}
	a, b := s.at(from), s.at(to)
	if b.at <= a.at {
		return errors.New("no samples in the saturated window")
	}
	r.goodput = (b.tokens - a.tokens) / (b.at - a.at).Seconds()

	var kvSum float64
	kvN := 0
	for _, sm := range s.samples {
		if sm.at < from || sm.at > to {
			continue
		}
		for _, u := range sm.kv {
			if !math.IsNaN(u) {
				kvSum += u
				kvN++
			}
		}
	}
	if kvN > 0 {
		r.kvMean = kvSum / float64(kvN)
	}
	// An overflow shows twice: as the simulator's out-of-memory event and
	// as the answers it failed. Either is counted, in case the other was
	// missed (a simulator killed before its last scrape).
	var ooms float64
	for i := range s.peak {
		r.kvPeak = max(r.kvPeak, s.peak[i])
		ooms += s.ooms[i]
	}
	r.overflow = max(ooms, float64(r.step.Overflowed))
	if r.kill {
		v := s.victim
		// Nothing tells the gateway that a backend died before a connection
		// to it fails (a probe's, or a request's): its streams cut by the
		// kill give their budget back first, and waiters bound there in that
		// moment fail to connect and are moved. Its admissions are counted
		// as they are handed over, a little after the bind: the check is
		// that none come a second after the circuit opened.
		r.noticed = -1
		var atKill float64
		for _, sm := range s.samples {
			if sm.at < s.killed {
				atKill = sm.admitted[v]
				continue
			}
			if r.noticed < 0 && sm.routed[v] == 0 {
				r.noticed = sm.at - s.killed
			}
			if r.noticed >= 0 && sm.at >= s.killed+r.noticed+time.Second {
				r.boundAround = sm.admitted[v] - atKill
				r.boundAfter = s.samples[len(s.samples)-1].admitted[v] - sm.admitted[v]
				break
			}
		}
		r.lostMidStream = end.Sum("kvgate_requests_total", `reason="upstream_incomplete"`) + end.Sum("kvgate_requests_total", `reason="upstream_error"`)
	}
	r.queueTimeouts = end.Sum("kvgate_admission_rejections_total", `reason="queue_timeout"`)
	r.noBackend = end.Sum("kvgate_requests_total", `reason="no_backend"`)
	r.noRouteWaits = end.Sum("kvgate_queue_wait_seconds_count", `result="no_route"`)
	r.noRouteSlow = r.noRouteWaits - bucketAtMost(end, `result="no_route"`, 1)
	return nil
}

var leLabel = regexp.MustCompile(`le="([^"]+)"`)

// bucketAtMost is the count of kvgate_queue_wait_seconds observations with
// labels want in the largest bucket at or under limit seconds.
func bucketAtMost(m benchkit.Metrics, want string, limit float64) float64 {
	bestLE, count := -1.0, 0.0
	for k, v := range m {
		if !strings.HasPrefix(k, "kvgate_queue_wait_seconds_bucket{") || !strings.Contains(k, want) {
			continue
		}
		sm := leLabel.FindStringSubmatch(k)
		if sm == nil {
			continue
		}
		le, err := strconv.ParseFloat(sm[1], 64)
		if err != nil || le > limit {
			continue
		}
		switch {
		case le > bestLE:
			bestLE, count = le, v
		case le == bestLE:
			count += v // the same bucket of another class
		}
	}
	return count
}

// countLines counts the lines of a log that contain s.
func countLines(path, s string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strings.Count(string(data), s), nil
}
