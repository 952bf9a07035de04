package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type check struct {
	name string
	ok   bool
	info string
}

func (s *soak) check(name string, ok bool, format string, a ...any) {
	s.checks = append(s.checks, check{name, ok, fmt.Sprintf(format, a...)})
}

type sample struct {
	at              int
	rss, goroutines float64
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// panics counts the lines of a log that tell of a panic.
func panics(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	return strings.Count(string(data), "panic")
}

func (s *soak) report(restErr error, elapsed time.Duration) error {
	t := &s.tally
	t.mu.Lock()
	defer t.mu.Unlock()
	tot := t.total()

	fmt.Printf("\nkvgate soak: %d requests, %d clients over 3 replicas sharing one budget through Redis (lease_ttl %s), sims with --on-overflow oom at --time-scale %g, %s on %d CPUs (%s/%s)\n",
		t.sent, s.o.concurrency, s.o.leaseTTL, s.o.TimeScale, elapsed.Round(time.Second), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	fmt.Printf("  %.0f requests/s while sending (%s of the run)\n\n", float64(t.sent)/s.loadTime.Seconds(), s.loadTime.Round(time.Second))
	row := func(name string, c *counts) {
		fmt.Printf("  %-22s %7d %7d %7d %7d %7d %7d %7d %7d\n", name, c.sent, c.answered, c.refused, c.failedEnd, c.canceled, c.broken, c.unshaped, c.netErrs)
	}
	fmt.Printf("  %-22s %7s %7s %7s %7s %7s %7s %7s %7s\n", "", "sent", "200", "error", "200+err", "hung up", "broken", "no shape", "transp.")
	for _, k := range sortedKeys(t.byRoute) {
		row(k, t.byRoute[k])
	}
	row("all", &tot)
	row("  of them half-closed", &t.halfClose)
	for _, k := range sortedKeys(t.byReplica) {
		row("  sent to "+k, t.byReplica[k])
	}
	fmt.Println("\n  200: a whole answer; error: an error status with an error in its API's shape; 200+err: a 200 stream that ended with an error event;")
	fmt.Println("  broken: a 200 that is not whole (a false success); no shape: an error without its API's shape; transp.: a transport error")
	fmt.Println("  reasons, each with its first message:")
	for _, k := range sortedKeys(t.reasons) {
		fmt.Printf("    %6d × %-32s %.160s\n", t.reasons[k], k, t.messages[k])
	}
	if len(t.timedOut) > 0 && s.gpuBudget > 0 {
		third := float64(s.gpuBudget) / 3
		above := 0
		for _, b := range t.timedOut {
			if b > third {
				above++
			}
		}
		fmt.Printf("  queue_timeout: %d of the %d needed more than a third of a GPU's budget (%s), a replica's fair level while all three want more\n",
			above, len(t.timedOut), mib(third))
	}
	for _, e := range t.examples {
		fmt.Printf("    e.g. %s\n", e)
	}

	// The overflow every simulator counted over its lives.
	var ooms, peaks []string
	var oomTotal float64
	for _, m := range s.sims {
		n := m.oomBefore + s.simMetric(m, "kvsim_oom_events_total")
		oomTotal += n
		ooms = append(ooms, fmt.Sprintf("%s %g", m.name, n))
		peaks = append(peaks, fmt.Sprintf("%s %.0f%%", m.name, 100*max(m.peakBefore, s.simMetric(m, "kvsim_kv_usage_peak_ratio"))))
	}
	fmt.Printf("  overflow (kvsim_oom_events_total): %s; peak KV use: %s\n", strings.Join(ooms, ", "), strings.Join(peaks, ", "))
	fmt.Println("  faults:")
	for _, f := range s.faults {
		fmt.Printf("    %s\n", f)
	}
	for _, r := range s.replicas {
		m := r.end.metrics
		fmt.Printf("  %s counted: ok %g, shed %g, rejected %g, failed %g, canceled %g; reloads ok %g, error %g\n", r.name,
			m.Sum("kvgate_requests_total", `outcome="ok"`), m.Sum("kvgate_requests_total", `outcome="shed"`), m.Sum("kvgate_requests_total", `outcome="rejected"`),
			m.Sum("kvgate_requests_total", `outcome="failed"`), m.Sum("kvgate_requests_total", `outcome="canceled"`),
			m.Sum("kvgate_config_reloads_total", `result="ok"`), m.Sum("kvgate_config_reloads_total", `result="error"`))
		fmt.Printf("     RSS: baseline %s", mib(r.base.rss))
		for _, x := range r.series {
			fmt.Printf(", %d: %s", x.at, mib(x.rss))
		}
		fmt.Printf(", end %s; goroutines: baseline %d, end %d\n", mib(r.end.rss), int(r.base.goroutines), int(r.end.goroutines))
	}
	fmt.Println()

	for _, r := range s.replicas {
		e, m := r.end, r.end.metrics
		s.check(r.name+" alive", r.proc.Alive(), "pid %d", r.proc.Pid())
		atRest := e.err == nil && e.held == 0 && e.running == 0 && e.bound == 0 && e.queued == 0 && e.inflight == 0
		s.check(r.name+" at rest", atRest, "%d bytes held or committed, %d running, %d bound, %d queued, %g in flight",
			e.held, e.running, e.bound, e.queued, e.inflight)
		// Idle, a replica gives back every whole chunk it leased.
		var over, lines []string
		for _, g := range sortedKeys(e.leased) {
			lines = append(lines, fmt.Sprintf("%s %s", g, mib(float64(e.leased[g]))))
			if e.leased[g] >= e.chunk[g] {
				over = append(over, g)
			}
		}
		info := fmt.Sprintf("%s leased at rest (a chunk: %s)", strings.Join(lines, ", "), mib(float64(e.chunk["sim0"])))
		if len(over) > 0 {
			info += "; a chunk or more on " + strings.Join(over, ", ")
		}
		s.check(r.name+" leases given back", e.leased != nil && len(over) == 0, "%s", info)
		internal := m.Sum("kvgate_requests_total", `reason="internal"`)
		s.check(r.name+" no internal errors", e.metrics != nil && internal == 0, "%g", internal)
		p := panics(r.proc.Log)
		s.check(r.name+" no panic logged", p == 0, "%d in %s", p, r.proc.Log)
		s.check(r.name+" goroutines back to baseline", e.goroutines >= 0 && e.goroutines <= r.base.goroutines+4, "%d at the end, %d at baseline", int(e.goroutines), int(r.base.goroutines))
		// Memory is flat when the end of the run is no higher than its
		// first tenth after warm-up, give or take the collector's swing.
		ref := r.base.rss
		if len(r.series) > 0 {
			ref = r.series[0].rss
		}
		s.check(r.name+" RSS flat", e.rss > 0 && e.rss <= ref*1.25+32<<20, "%s at the end, %s after the first tenth, %s at baseline", mib(e.rss), mib(ref), mib(r.base.rss))
		ok, bad := m.Sum("kvgate_config_reloads_total", `result="ok"`), m.Sum("kvgate_config_reloads_total", `result="error"`)
		s.check(r.name+" reloads counted", ok == float64(r.reloadsOK) && bad == float64(r.reloadsBad), "ok %g of %d, refused %g of %d", ok, r.reloadsOK, bad, r.reloadsBad)
	}
	s.check("zero overflow on every simulator", oomTotal == 0, "%s", strings.Join(ooms, ", "))
	s.check("every request answered", tot.unshaped == 0 && tot.netErrs == 0 && tot.answered+tot.refused+tot.failedEnd+tot.broken+tot.canceled == tot.sent,
		"%d of %d: %d whole 200s, %d errors in shape, %d streams ended by an error event, %d hung up on purpose; %d errors without a shape, %d transport errors",
		tot.answered+tot.refused+tot.failedEnd+tot.canceled, tot.sent, tot.answered, tot.refused, tot.failedEnd, tot.canceled, tot.unshaped, tot.netErrs)
	s.check("no false success", tot.broken == 0, "%d 200s not whole (streams without their end or an error event, cut or empty bodies)", tot.broken)
	hc := t.halfClose
	s.check("half-closed clients answered", hc.sent > 0 && hc.broken == 0 && hc.unshaped == 0 && hc.netErrs == 0,
		"%d of %d: %d whole 200s, %d errors in shape, %d ended by an error event", hc.answered+hc.refused+hc.failedEnd, hc.sent, hc.answered, hc.refused, hc.failedEnd)
	var idle, served []string
	for _, k := range apiNames {
		if c := t.byRoute[k]; c == nil || c.answered == 0 {
			idle = append(idle, k)
		} else {
			served = append(served, fmt.Sprintf("%s %d", k, c.answered))
		}
	}
	info := "whole 200s: " + strings.Join(served, ", ")
	if len(idle) > 0 {
		info = "none on: " + strings.Join(idle, ", ")
	}
	s.check("every route answered 200s", len(idle) == 0, "%s", info)

	failed := 0
	for _, c := range s.checks {
		mark := "ok  "
		if !c.ok {
			mark, failed = "FAIL", failed+1
		}
		fmt.Printf("  %s %-36s %s\n", mark, c.name, c.info)
	}
	if restErr != nil {
		fmt.Printf("\n  %v\n", restErr)
	}
	if failed > 0 {
		// A replica whose goroutines did not come back dumps them into its
		// log (SIGQUIT ends it): the log says which are left.
		for _, r := range s.replicas {
			if r.end.goroutines > r.base.goroutines+4 && r.proc.Alive() {
				_ = r.proc.Signal(syscall.SIGQUIT)
				fmt.Printf("  %s's goroutines dumped into %s\n", r.name, r.proc.Log)
			}
		}
		return errors.New(strconv.Itoa(failed) + " checks failed; logs in " + s.kit.Dir)
	}
	os.RemoveAll(s.kit.Dir)
	return nil
}
