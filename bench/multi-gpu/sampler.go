package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// sample is one look at the gateway and the simulators.
type sample struct {
	at       time.Duration
	inflight float64
	ok       float64   // requests answered, warm-up included
	tokens   float64   // output tokens of answered requests
	kv       []float64 // each simulator's own KV use (share of its pool); NaN once dead
	routed   []float64 // kvgate_backend_up per backend
	admitted []float64 // kvgate_admissions_total per GPU
	// The gateway's view of each GPU: what it has committed (the forecast
	// peak) and what its backend last reported in use, as shares of its
	// budget.
	committed, used []float64
}

// sampler scrapes the gateway and every simulator each interval, and kills
// the victim once killAfter requests were answered.
type sampler struct {
	client    *http.Client
	gateway   string
	sims      []*benchkit.Process
	start     time.Time
	killAfter float64 // 0: kill nobody
	victim    int

	// Written by run, read once it has returned.
	samples []sample
	killed  time.Duration // -1 until the kill
	peak    []float64     // kvsim_kv_usage_peak_ratio, last seen per simulator
	ooms    []float64     // kvsim_oom_events_total, last seen per simulator
	errs    int
}

func (s *sampler) run(ctx context.Context) {
	s.killed = -1
	s.peak, s.ooms = make([]float64, len(s.sims)), make([]float64, len(s.sims))
	dead := make([]bool, len(s.sims))
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n := len(s.sims)
		sm := sample{at: time.Since(s.start), kv: make([]float64, n), routed: make([]float64, n),
			admitted: make([]float64, n), committed: make([]float64, n), used: make([]float64, n)}
		gm, err := benchkit.Scrape(ctx, s.client, s.gateway+"/metrics")
		if err == nil {
			sm.inflight = gm.Sum("kvgate_requests_in_flight")
			sm.ok = gm.Sum("kvgate_requests_total", `outcome="ok"`)
			sm.tokens = gm.Sum("kvgate_tokens_actual_total", `kind="output"`)
			for i := range s.sims {
				sm.routed[i] = gm.Sum("kvgate_backend_up", fmt.Sprintf(`backend="sim%d"`, i))
				gpu := fmt.Sprintf(`gpu="sim%d"`, i)
				sm.admitted[i] = gm.Sum("kvgate_admissions_total", gpu)
				if c := gm.Sum("kvgate_kv_capacity_bytes", gpu); c > 0 {
					sm.committed[i] = gm.Sum("kvgate_kv_committed_bytes", gpu) / c
					sm.used[i] = gm.Sum("kvgate_kv_used_bytes", gpu) / c
				}
			}
		}
		for i, p := range s.sims {
			sm.kv[i] = math.NaN()
			if dead[i] {
				continue
			}
			m, err := benchkit.Scrape(ctx, s.client, p.URL+"/metrics")
			if err != nil {
				s.errs++
				continue
			}
			sm.kv[i] = m.Sum("vllm:kv_cache_usage_perc")
			s.peak[i] = m.Sum("kvsim_kv_usage_peak_ratio")
			s.ooms[i] = m.Sum("kvsim_oom_events_total")
		}
		if ctx.Err() != nil {
			return // a scrape cut short by the end is no sample
		}
		if err == nil {
			s.samples = append(s.samples, sm)
		}
		if s.killAfter > 0 && s.killed < 0 && err == nil && sm.ok >= s.killAfter {
			s.sims[s.victim].Kill()
			dead[s.victim] = true
			s.killed = time.Since(s.start)
			fmt.Fprintf(os.Stderr, "  SIGKILL sim%d at %.1f s, %.0f requests answered\n", s.victim, s.killed.Seconds(), sm.ok)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// writeCSV writes the samples, one a line, for a closer look at a run.
func (s *sampler) writeCSV(path string) error {
	var b strings.Builder
	b.WriteString("t_s,in_flight,answered,output_tokens")
	for i := range s.sims {
		fmt.Fprintf(&b, ",sim%[1]d_kv,sim%[1]d_routed,sim%[1]d_admitted,sim%[1]d_committed,sim%[1]d_used", i)
	}
	b.WriteByte('\n')
	for _, sm := range s.samples {
		fmt.Fprintf(&b, "%.3f,%g,%g,%g", sm.at.Seconds(), sm.inflight, sm.ok, sm.tokens)
		for i := range s.sims {
			fmt.Fprintf(&b, ",%.4f,%g,%g,%.4f,%.4f", sm.kv[i], sm.routed[i], sm.admitted[i], sm.committed[i], sm.used[i])
		}
		b.WriteByte('\n')
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// at is the sample nearest to t.
func (s *sampler) at(t time.Duration) sample {
	best := s.samples[0]
	for _, sm := range s.samples {
		if (sm.at - t).Abs() < (best.at - t).Abs() {
			best = sm
		}
	}
	return best
}
