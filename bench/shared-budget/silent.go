package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Silent replicas: a replica stops calling Redis three ways under the
// saturating load. r1 paused (SIGSTOP) past its TTL, and r2 cut off from
// Redis: their requests may run on, and nothing may overflow. r3 killed
// (SIGKILL): its requests were aborted with its connections, the backend's
// figures end its hold, and r1+r2 must bring the GPU's real KV use back to
// 70% within 5 s.

// silentFor is how long r3 stays silent when paused or cut off: past its
// 3 s TTL by 10 s.
const silentFor = 13 * time.Second

// paused stops r1 with SIGSTOP for silentFor, then resumes it.
func (b *bench) paused(l *load) {
	b.silent(l, 0, "SIGSTOP r1 13 s (TTL 3 s)", func() {
		_ = b.replicaProcs[0].Signal(syscall.SIGSTOP)
	}, func() {
		_ = b.replicaProcs[0].Signal(syscall.SIGCONT)
	})
}

// cutOff cuts r2 off from Redis for silentFor while r1 and r3 reach it.
func (b *bench) cutOff(l *load) {
	b.silent(l, 1, "r2 cut off from Redis 13 s", func() { b.cut.setCut(true) }, func() { b.cut.setCut(false) })
}

// silent runs one silence of replica i and books its row: what the others
// leased while it was silent, overflow (none).
func (b *bench) silent(l *load, i int, phase string, stop, resume func()) {
	var others []string
	for k, u := range b.replicas {
		if k != i {
			others = append(others, u)
		}
	}
	okB, shedB, failB, _ := l.counts()
	oomB := b.oomSince()
	st, _ := b.status(b.replicas[i])
	before, _, _ := b.leasesOf(others...)
	fmt.Fprintf(os.Stderr, "%s (it leases %d bytes)...\n", phase, st.leased)
	kv := b.sampleKV()
	stop()
	var most int64
	for start := time.Now(); time.Since(start) < silentFor; time.Sleep(200 * time.Millisecond) {
		if v, _, _ := b.leasesOf(others...); v > most {
			most = v
		}
	}
	resume()
	mean, peak := kv.end()
	time.Sleep(5 * time.Second) // back in the fleet before the next phase
	okA, shedA, failA, _ := l.counts()
	oom := b.oomSince() - oomB
	b.row(phase, "r1+r2+r3", strconv.FormatInt(okA-okB, 10), strconv.FormatInt(shedA-shedB, 10), strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oom, 10),
		pct(mean), pct(peak), fmt.Sprintf("it leased %.0f MiB; the others %.0f MiB before, at most %.0f MiB while it was silent",
			mib(st.leased), mib(before), mib(most)))
	b.check(oom == 0, "%s: %d out-of-memory events (0); the others leased at most %.0f MiB of %.0f MiB beside its %.0f MiB",
		phase, oom, mib(most), mib(st.budget), mib(st.leased))
}

// killed kills r3 with SIGKILL and follows the GPU's real KV use: the time
// from the kill until it is at 70% or more and stays there (to 10 s), the
// use at 5 s, and when r1+r2 leased r3's part.
func (b *bench) killed(l *load) {
	st3, _ := b.status(b.replicas[2])
	lease12, _, _ := b.leasesOf(b.replicas[0], b.replicas[1])
	okB, shedB, failB, _ := l.counts()
	oomB := b.oomSince()
	fmt.Fprintf(os.Stderr, "SIGKILL r3 (holding %d bytes)...\n", st3.leased)
	b.replicaProcs[2].Kill()
	killed := time.Now()
	var (
		tookLease, reached time.Duration
		gotLease           bool
		window             []float64 // the last second's samples
		at5, sum           float64
		n                  int
	)
	for time.Since(killed) < 10*time.Second {
		since := time.Since(killed)
		if v, err := b.simGauge("vllm:kv_cache_usage_perc"); err == nil {
			// The KV use over the last second: a closed loop's use swings
			// from step to step.
			if window = append(window, v); len(window) > 10 {
				window = window[1:]
			}
			var avg float64
			for _, w := range window {
				avg += w
			}
			avg /= float64(len(window))
			if reached == 0 && len(window) == 10 && avg >= 0.70 {
				reached = since
			}
			if since >= 5*time.Second {
				if at5 == 0 {
					at5 = avg
				}
				sum += v
				n++
			}
		}
		if l12, _, _ := b.leasesOf(b.replicas[0], b.replicas[1]); !gotLease && l12 >= lease12+st3.leased*9/10 {
			gotLease, tookLease = true, since
		}
		time.Sleep(100 * time.Millisecond)
	}
	okA, shedA, failA, _ := l.counts()
	oom := b.oomSince() - oomB
	mean := sum / float64(max(n, 1))
	held := reached > 0
	note := fmt.Sprintf("r3 leased %.0f MiB: r1+r2 leased 90%% of it after %.1f s (%v); real KV use (1 s mean) >= 70%% after %.1f s, %s at 5 s, %s over 5-10 s",
		mib(st3.leased), tookLease.Seconds(), gotLease, reached.Seconds(), pct(at5), pct(mean))
	b.row("SIGKILL r3 mid-run", "r1+r2", strconv.FormatInt(okA-okB, 10), strconv.FormatInt(shedA-shedB, 10), strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oom, 10), pct(mean), "", note)
	b.check(held && reached <= 5*time.Second && mean >= 0.70, "killed replica: real KV use (1 s mean) at >= 70%% after %.1f s (<= 5 s), %s over 5-10 s", reached.Seconds(), pct(mean))
	b.check(oom == 0, "killed replica: %d out-of-memory events (0)", oom)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
