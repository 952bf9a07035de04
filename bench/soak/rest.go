package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

func (s *soak) metrics() (benchkit.Metrics, error) {
	return benchkit.Scrape(context.Background(), s.client, s.gwURL+"/metrics")
}

// atRest is the gateway once its clients are idle.
type atRest struct {
	goroutines, rss, inflight float64
	held, queued, bound       int64
	metrics                   benchkit.Metrics
}

// rest waits for the gateway to be idle — nothing in flight, idle client
// connections closed — and reads its state.
func (s *soak) rest(ctx context.Context) (atRest, error) {
	s.client.CloseIdleConnections()
	var r atRest
	deadline := time.Now().Add(20 * time.Second)
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		m, err := s.metrics()
		s.client.CloseIdleConnections()
		if err != nil {
			last = err
			time.Sleep(200 * time.Millisecond)
			continue
		}
		st, err := s.status()
		if err != nil {
			last = err
			time.Sleep(200 * time.Millisecond)
			continue
		}
		r = atRest{goroutines: m["go_goroutines"], rss: m["process_resident_memory_bytes"], inflight: m["kvgate_requests_in_flight"], metrics: m}
		for _, g := range st.GPUs {
			r.held += g.Held + g.Committed
			r.bound += int64(g.Bound)
		}
		for _, q := range st.Queues {
			r.queued += int64(q.Queued)
		}
		if r.inflight == 0 && r.held == 0 && r.queued == 0 && r.bound == 0 {
			return r, nil
		}
		last = fmt.Errorf("in flight %g, held %d, queued %d, bound %d", r.inflight, r.held, r.queued, r.bound)
		time.Sleep(200 * time.Millisecond)
	}
	return r, fmt.Errorf("the gateway did not come to rest within 20s: %v", last)
}

type statusView struct {
	GPUs []struct {
		GPU       string `json:"gpu"`
		Held      int64  `json:"held_bytes"`
		Committed int64  `json:"committed_bytes"`
		Bound     int    `json:"bound_requests"`
	} `json:"gpus"`
	Queues []struct {
		Model  string `json:"model"`
		Queued int    `json:"queued"`
	} `json:"queues"`
}

func (s *soak) status() (statusView, error) {
	var v statusView
	err := benchkit.Status(context.Background(), s.client, s.gwURL, &v)
	return v, err
}

// settledGoroutines waits for the gateway's goroutines to settle once its
// clients are gone — fasthttp ends idle workers 10 s after their last
// request — and returns the count: the same every time the gateway is at
// rest, unless something leaks.
func (s *soak) settledGoroutines() float64 {
	var g, low float64 = 0, -1
	var lowAt time.Time
	for deadline := time.Now().Add(40 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		s.client.CloseIdleConnections()
		m, err := s.metrics()
		if err != nil {
			continue
		}
		g = m["go_goroutines"]
		if low < 0 || g < low {
			low, lowAt = g, time.Now()
		}
		if time.Since(lowAt) > 12*time.Second {
			break
		}
	}
	return low
}
