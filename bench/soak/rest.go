package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// probe reads the replicas' pages: a paused replica's, or one waiting on
// Redis, must not hang the run.
var probe = &http.Client{Timeout: 5 * time.Second}

func (s *soak) metrics(r *replica) (benchkit.Metrics, error) {
	return benchkit.Scrape(context.Background(), probe, r.url+"/metrics")
}

// atRest is a replica once its clients are idle.
type atRest struct {
	goroutines, rss, inflight float64
	held, running, queued     int64
	bound                     int64
	// leases: what it still leases, per GPU, once settled, and a chunk of
	// each GPU's budget (what it may keep idle)
	leased, chunk map[string]int64
	metrics       benchkit.Metrics
	err           error // it did not come to rest
}

// restAll waits for every replica to come to rest (at the same time, as
// their clients are idle together) and keeps each one's state where
// into says; an error names those that did not.
func (s *soak) restAll(ctx context.Context, into func(*replica) *atRest) error {
	s.client.CloseIdleConnections()
	var wg sync.WaitGroup
	for _, r := range s.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := into(r)
			*a = s.rest(ctx, r)
			a.goroutines = s.settledGoroutines(r)
			a.leased, a.chunk = s.leases(r)
			if m, err := s.metrics(r); err == nil {
				a.rss = m["process_resident_memory_bytes"]
			}
		}()
	}
	wg.Wait()
	var errs []error
	for _, r := range s.replicas {
		if err := into(r).err; err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.name, err))
		}
	}
	return errors.Join(errs...)
}

// rest waits for a replica to be idle — nothing in flight, held, running,
// queued or bound — and reads its state.
func (s *soak) rest(ctx context.Context, rep *replica) atRest {
	var r atRest
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		m, err := s.metrics(rep)
		if err != nil {
			last = err
			time.Sleep(200 * time.Millisecond)
			continue
		}
		st, err := s.status(rep)
		if err != nil {
			last = err
			time.Sleep(200 * time.Millisecond)
			continue
		}
		r = atRest{rss: m["process_resident_memory_bytes"], inflight: m["kvgate_requests_in_flight"], metrics: m}
		for _, g := range st.GPUs {
			r.held += g.Held + g.Committed
			r.running += g.Running
			r.bound += int64(g.Bound)
		}
		for _, q := range st.Queues {
			r.queued += int64(q.Queued)
		}
		if r.inflight == 0 && r.held == 0 && r.running == 0 && r.queued == 0 && r.bound == 0 {
			return r
		}
		last = fmt.Errorf("in flight %g, held %d, running %d, queued %d, bound %d", r.inflight, r.held, r.running, r.queued, r.bound)
		time.Sleep(200 * time.Millisecond)
	}
	r.err = fmt.Errorf("did not come to rest within 30s: %v", last)
	return r
}

type statusView struct {
	GPUs []struct {
		GPU       string `json:"gpu"`
		Held      int64  `json:"held_bytes"`
		Committed int64  `json:"committed_bytes"`
		Running   int64  `json:"running_bytes"`
		Bound     int    `json:"bound_requests"`
	} `json:"gpus"`
	Queues []struct {
		Model  string `json:"model"`
		Queued int    `json:"queued"`
	} `json:"queues"`
	SharedBudget *struct {
		GPUs []struct {
			GPU      string `json:"gpu"`
			Leased   int64  `json:"leased_bytes"`
			Budget   int64  `json:"budget_bytes"`
			Fallback bool   `json:"fallback"`
			Fleet    []struct {
				Replica  string `json:"replica"`
				Bytes    int64  `json:"leased_bytes"`
				Residual bool   `json:"residual"`
			} `json:"fleet"`
			FleetAsOf string `json:"fleet_as_of"`
		} `json:"gpus"`
	} `json:"shared_budget"`
}

// leases is what a replica leases per GPU and the chunk of each GPU's
// budget, the most it may keep idle (shared_budget.chunk: 2% by default).
func (s *soak) leases(r *replica) (leased, chunk map[string]int64) {
	st, err := s.status(r)
	if err != nil || st.SharedBudget == nil {
		return nil, nil
	}
	leased, chunk = map[string]int64{}, map[string]int64{}
	for _, g := range st.SharedBudget.GPUs {
		leased[g.GPU] = g.Leased
		chunk[g.GPU] = (g.Budget*2 + 99) / 100
	}
	return leased, chunk
}

// listedSince says whether every GPU's fleet list was read from Redis
// after t.
func (v statusView) listedSince(t time.Time) bool {
	if v.SharedBudget == nil {
		return false
	}
	for _, g := range v.SharedBudget.GPUs {
		at, err := time.Parse(time.RFC3339Nano, g.FleetAsOf)
		if err != nil || at.Before(t) {
			return false
		}
	}
	return true
}

// fallback says whether the replica admits on its static share on every
// GPU: Redis is out of its reach.
func (v statusView) fallback() bool {
	if v.SharedBudget == nil || len(v.SharedBudget.GPUs) == 0 {
		return false
	}
	for _, g := range v.SharedBudget.GPUs {
		if !g.Fallback {
			return false
		}
	}
	return true
}

func (s *soak) status(r *replica) (statusView, error) {
	var v statusView
	err := benchkit.Status(context.Background(), probe, r.url, &v)
	return v, err
}

// settledGoroutines waits for a replica's goroutines to settle once its
// clients are gone and returns the count: the same every time the gateway
// is at rest, unless something leaks. fasthttp ends a worker once it has
// been idle 10 s, at a sweep that runs every 10 s: a worker may live 20 s
// past its last request, so the count is the lowest seen once it has not
// fallen for 25 s.
func (s *soak) settledGoroutines(r *replica) float64 {
	var g, low float64 = 0, -1
	var lowAt time.Time
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		s.client.CloseIdleConnections()
		m, err := s.metrics(r)
		if err != nil {
			continue
		}
		g = m["go_goroutines"]
		if low < 0 || g < low {
			low, lowAt = g, time.Now()
		}
		if time.Since(lowAt) > 25*time.Second {
			break
		}
	}
	return low
}
