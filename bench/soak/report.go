package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync/atomic"
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

func (s *soak) report(base, end atRest, series []sample, reloadsOK, reloadsBad int, elapsed time.Duration) error {
	m := end.metrics
	end.goroutines = s.settledGoroutines()
	if final, err := s.metrics(); err == nil {
		end.rss = final["process_resident_memory_bytes"]
	}
	statuses := map[int]int64{}
	var codes []int
	s.codes.Range(func(k, v any) bool {
		statuses[k.(int)] = v.(*atomic.Int64).Load()
		codes = append(codes, k.(int))
		return true
	})
	sort.Ints(codes)

	// Memory is flat when the end of the run is no higher than its first
	// tenth after warm-up, give or take the collector's swing.
	rssRef := base.rss
	if len(series) > 0 {
		rssRef = series[0].rss
	}
	rssFlat := end.rss <= rssRef*1.25+32<<20
	internal := m.Sum("kvgate_requests_total", `reason="internal"`)
	s.check("gateway alive", s.gw.Alive(), "pid %d", s.gw.Pid())
	s.check("nothing held", end.held == 0 && end.bound == 0, "%d bytes held or committed, %d requests bound", end.held, end.bound)
	s.check("queues empty", end.queued == 0, "%d queued", end.queued)
	s.check("nothing in flight", end.inflight == 0, "%g", end.inflight)
	s.check("goroutines back to baseline", end.goroutines <= base.goroutines+4, "%d at the end, %d at baseline", int(end.goroutines), int(base.goroutines))
	s.check("RSS flat", rssFlat, "%s at the end, %s after the first tenth, %s at baseline", mib(end.rss), mib(rssRef), mib(base.rss))
	s.check("good reloads applied", m.Sum("kvgate_config_reloads_total", `result="ok"`) == float64(reloadsOK), "%g of %d", m.Sum("kvgate_config_reloads_total", `result="ok"`), reloadsOK)
	s.check("broken reload refused and counted", m.Sum("kvgate_config_reloads_total", `result="error"`) == float64(reloadsBad), "%g of %d", m.Sum("kvgate_config_reloads_total", `result="error"`), reloadsBad)
	s.check("no internal errors", internal == 0, "%g", internal)
	s.check("no broken 200 streams", s.broken.Load() == 0, "%d streams ended without [DONE] or an error event", s.broken.Load())
	s.check("no transport errors but our own hang-ups", s.netErrs.Load() == 0, "%d", s.netErrs.Load())

	fmt.Printf("\nkvgate soak: %d requests, %d clients, sims at --time-scale %g, %s on %d CPUs (%s/%s)\n",
		s.sent.Load(), s.o.concurrency, s.o.TimeScale, elapsed.Round(time.Second), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	fmt.Printf("  %.0f requests/s while sending (%s of the run)\n", float64(s.sent.Load())/s.loadTime.Seconds(), s.loadTime.Round(time.Second))
	fmt.Printf("  client saw:")
	for _, c := range codes {
		fmt.Printf(" %d×%d", statuses[c], c)
	}
	fmt.Printf(", %d hung up on purpose\n", s.canceled.Load())
	fmt.Printf("  gateway counted: ok %g, shed %g, rejected %g, failed %g, canceled %g\n",
		m.Sum("kvgate_requests_total", `outcome="ok"`), m.Sum("kvgate_requests_total", `outcome="shed"`), m.Sum("kvgate_requests_total", `outcome="rejected"`),
		m.Sum("kvgate_requests_total", `outcome="failed"`), m.Sum("kvgate_requests_total", `outcome="canceled"`))
	fmt.Printf("  faults: sim1 killed at 25%%, restarted at 40%%; %d reloads, 1 broken\n", reloadsOK+reloadsBad)
	fmt.Printf("  RSS: baseline %s", mib(base.rss))
	for _, x := range series {
		fmt.Printf(", %d: %s", x.at, mib(x.rss))
	}
	fmt.Printf(", end %s\n", mib(end.rss))
	fmt.Printf("  goroutines: baseline %d, end %d\n\n", int(base.goroutines), int(end.goroutines))
	failed := 0
	for _, c := range s.checks {
		mark := "ok  "
		if !c.ok {
			mark, failed = "FAIL", failed+1
		}
		fmt.Printf("  %s %-42s %s\n", mark, c.name, c.info)
	}
	if failed > 0 {
		return errors.New(strconv.Itoa(failed) + " checks failed; logs in " + s.kit.Dir)
	}
	os.RemoveAll(s.kit.Dir)
	return nil
}
