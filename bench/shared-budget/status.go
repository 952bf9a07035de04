package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// gpuStatus is what the bench reads of a gateway's /status.
type gpuStatus struct {
	budget, committed, limit int64
	leased                   int64
	fallback                 bool
	fleet                    map[string]int64
	tenants                  map[string]int64 // held bytes by tenant
}

func (b *bench) status(url string) (gpuStatus, error) {
	var v struct {
		GPUs []struct {
			Capacity  int64  `json:"capacity_bytes"`
			Committed int64  `json:"committed_bytes"`
			Limit     *int64 `json:"limit_bytes"`
		} `json:"gpus"`
		Tenants []struct {
			Name string `json:"name"`
			Held int64  `json:"held_bytes"`
		} `json:"tenants"`
		SharedBudget *struct {
			GPUs []struct {
				Leased   int64 `json:"leased_bytes"`
				Fallback bool  `json:"fallback"`
				Fleet    []struct {
					Replica string `json:"replica"`
					Bytes   int64  `json:"leased_bytes"`
				} `json:"fleet"`
			} `json:"gpus"`
		} `json:"shared_budget"`
	}
	if err := benchkit.Status(context.Background(), http.DefaultClient, url, &v); err != nil {
		return gpuStatus{}, err
	}
	if len(v.GPUs) != 1 {
		return gpuStatus{}, fmt.Errorf("%s/status: %d GPUs", url, len(v.GPUs))
	}
	s := gpuStatus{budget: v.GPUs[0].Capacity, committed: v.GPUs[0].Committed, limit: -1, fleet: map[string]int64{}, tenants: map[string]int64{}}
	if v.GPUs[0].Limit != nil {
		s.limit = *v.GPUs[0].Limit
	}
	for _, t := range v.Tenants {
		s.tenants[t.Name] = t.Held
	}
	if sb := v.SharedBudget; sb != nil && len(sb.GPUs) == 1 {
		s.leased, s.fallback = sb.GPUs[0].Leased, sb.GPUs[0].Fallback
		for _, h := range sb.GPUs[0].Fleet {
			s.fleet[h.Replica] = h.Bytes
		}
	}
	return s, nil
}

func (b *bench) leasesOf(urls ...string) (leased, committed int64, fallback int) {
	for _, u := range urls {
		st, err := b.status(u)
		if err != nil {
			continue
		}
		leased += st.leased
		committed += st.committed
		if st.fallback {
			fallback++
		}
	}
	return leased, committed, fallback
}

func (b *bench) simGauge(name string) (float64, error) {
	m, err := benchkit.Scrape(context.Background(), http.DefaultClient, b.simURL+"/metrics")
	if err != nil {
		return 0, err
	}
	v, ok := m.Value(name)
	if !ok {
		return 0, fmt.Errorf("the simulator exports no %s", name)
	}
	return v, nil
}

// oomSince is the simulator's out-of-memory events since the start.
func (b *bench) oomSince() int64 {
	v, err := b.simGauge("kvsim_oom_events_total")
	if err != nil {
		return -1
	}
	return int64(v - b.oomBefore)
}

// kvSampler reads the simulator's KV usage every 200 ms.
type kvSampler struct {
	mu      sync.Mutex
	samples []float64
	stop    chan struct{}
	done    chan struct{}
}

func (b *bench) sampleKV() *kvSampler {
	s := &kvSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			if v, err := b.simGauge("vllm:kv_cache_usage_perc"); err == nil {
				s.mu.Lock()
				s.samples = append(s.samples, v)
				s.mu.Unlock()
			}
		}
	}()
	return s
}

func (s *kvSampler) end() (mean, peak float64) {
	close(s.stop)
	<-s.done
	for _, v := range s.samples {
		mean += v
		peak = max(peak, v)
	}
	if len(s.samples) > 0 {
		mean /= float64(len(s.samples))
	}
	return mean, peak
}
