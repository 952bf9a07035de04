package backends

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// KVReport is what a backend's /metrics says about its KV cache, under
// vLLM's metric names.
type KVReport struct {
	At time.Time

	// Usage is the fraction of the backend's KV blocks in use, 0–1
	// (vllm:kv_cache_usage_perc, or the older vllm:gpu_cache_usage_perc).
	Usage    float64
	HasUsage bool

	Running     float64 // vllm:num_requests_running
	Waiting     float64 // vllm:num_requests_waiting
	Preemptions float64 // vllm:num_preemptions_total (a counter)

	// From vllm:cache_config_info's labels: the backend's own pool.
	NumGPUBlocks         int64
	BlockSize            int
	GPUMemoryUtilization float64
	// PrefixCaching says the backend holds a full prompt block once for
	// every running request that shares it (enable_prefix_caching). Absent
	// from the report, it is false: a block is never taken as shared on a
	// backend that has not said it shares.
	PrefixCaching bool
	// PrefixQueries and PrefixHits are the backend's prefix-cache counters
	// (vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total): the
	// prompt tokens it looked up and those it found cached, in whole
	// blocks. HasPrefixCounters says it reports them. A backend that shares
	// without the label says so here.
	PrefixQueries, PrefixHits float64
	HasPrefixCounters         bool
}

// HasPool says whether the backend reported the size of its KV pool.
func (r KVReport) HasPool() bool { return r.NumGPUBlocks > 0 && r.BlockSize > 0 }

// ParseMetrics reads a Prometheus text exposition. A backend serving several
// models reports each under its model_name label: usage is the highest of
// them, counts are summed.
func ParseMetrics(in io.Reader, at time.Time) (KVReport, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(in)
	if err != nil {
		return KVReport{}, fmt.Errorf("parse metrics: %w", err)
	}
	r := KVReport{At: at}
	for _, name := range []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"} {
		if f, ok := fams[name]; ok && len(f.GetMetric()) > 0 {
			for _, m := range f.GetMetric() {
				r.Usage = max(r.Usage, value(m))
			}
			r.HasUsage = true
			break
		}
	}
	r.Running = sum(fams["vllm:num_requests_running"])
	r.Waiting = sum(fams["vllm:num_requests_waiting"])
	if f, ok := fams["vllm:num_preemptions_total"]; ok {
		r.Preemptions = sum(f)
	} else {
		r.Preemptions = sum(fams["vllm:num_preemptions"])
	}
	q, qok := fams["vllm:prefix_cache_queries_total"]
	h, hok := fams["vllm:prefix_cache_hits_total"]
	if qok && hok {
		r.PrefixQueries, r.PrefixHits, r.HasPrefixCounters = sum(q), sum(h), true
	}
	if f, ok := fams["vllm:cache_config_info"]; ok {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "num_gpu_blocks":
					r.NumGPUBlocks, _ = strconv.ParseInt(l.GetValue(), 10, 64)
				case "block_size":
					r.BlockSize, _ = strconv.Atoi(l.GetValue())
				case "gpu_memory_utilization":
					r.GPUMemoryUtilization, _ = strconv.ParseFloat(l.GetValue(), 64)
				case "enable_prefix_caching":
					r.PrefixCaching = strings.EqualFold(l.GetValue(), "true")
				}
			}
		}
	}
	return r, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

func sum(f *dto.MetricFamily) float64 {
	var s float64
	for _, m := range f.GetMetric() {
		s += value(m)
	}
	return s
}
