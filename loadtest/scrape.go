package loadtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxMetricsBody bounds one /metrics read; a vLLM server's is tens of KiB.
const maxMetricsBody = 8 << 20

// MetricsSample is one scrape of a vLLM-style /metrics endpoint. Each Has*
// says whether the server exposed that series; a missing series is unknown,
// never zero. Where a server exposes several series of one name (several
// engines, several models) KV usage is their maximum — the fullest cache is
// the one that overflows — and counts are their sum.
type MetricsSample struct {
	At time.Time `json:"-"`

	KVUsage float64 `json:"kv_usage"` // fraction of KV blocks in use, 0–1
	HasKV   bool    `json:"-"`
	// KVSource is the series KVUsage came from: vllm:kv_cache_usage_perc
	// (vLLM ≥ 0.10), else vllm:gpu_cache_usage_perc.
	KVSource string `json:"-"`

	Running    float64 `json:"running"`
	HasRunning bool    `json:"-"`
	Waiting    float64 `json:"waiting"`
	HasWaiting bool    `json:"-"`

	Preemptions    float64 `json:"preemptions_total"`
	HasPreemptions bool    `json:"-"`

	// kvgate sim extras: out-of-memory events, its own exact KV peak, and
	// whether it is serving (0 while it restarts after an OOM event).
	OOMEvents  float64 `json:"-"`
	HasOOM     bool    `json:"-"`
	KVPeak     float64 `json:"-"`
	HasKVPeak  bool    `json:"-"`
	Healthy    bool    `json:"-"`
	HasHealthy bool    `json:"-"`

	// From vllm:cache_config_info's labels; 0 when absent.
	NumGPUBlocks int `json:"-"`
	BlockSize    int `json:"-"`
}

// Metric names, as vLLM spells them.
const (
	metricKVUsage     = "vllm:kv_cache_usage_perc"
	metricGPUCache    = "vllm:gpu_cache_usage_perc"
	metricRunning     = "vllm:num_requests_running"
	metricWaiting     = "vllm:num_requests_waiting"
	metricPreemptions = "vllm:num_preemptions_total"
	metricCacheConfig = "vllm:cache_config_info"
	metricSimOOM      = "kvsim_oom_events_total"
	metricSimKVPeak   = "kvsim_kv_usage_peak_ratio"
	metricSimHealthy  = "kvsim_healthy"
)

// ParseMetrics reads the Prometheus text exposition format with
// Prometheus' own parser (expfmt, as the gateway's backends package reads
// the same pages), keeping only the series loadtest uses. A body that is
// not the format is an error, as it is to Prometheus: a scrape that fails
// is counted and reported, never read as zeros.
func ParseMetrics(body []byte) (MetricsSample, error) {
	var s MetricsSample
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return s, fmt.Errorf("parse metrics: %w", err)
	}
	samples := 0
	each := func(name string, f func(v float64, m *dto.Metric)) bool {
		fam, ok := fams[name]
		if !ok || len(fam.GetMetric()) == 0 {
			return false
		}
		for _, m := range fam.GetMetric() {
			if v := value(m); !math.IsNaN(v) {
				f(v, m)
			}
		}
		return true
	}
	for _, f := range fams {
		samples += len(f.GetMetric())
	}
	var kv float64
	switch {
	case each(metricKVUsage, func(v float64, _ *dto.Metric) { kv = max(kv, v) }):
		s.KVUsage, s.HasKV, s.KVSource = kv, true, metricKVUsage
	case each(metricGPUCache, func(v float64, _ *dto.Metric) { kv = max(kv, v) }):
		s.KVUsage, s.HasKV, s.KVSource = kv, true, metricGPUCache
	}
	s.HasRunning = each(metricRunning, func(v float64, _ *dto.Metric) { s.Running += v })
	s.HasWaiting = each(metricWaiting, func(v float64, _ *dto.Metric) { s.Waiting += v })
	s.HasPreemptions = each(metricPreemptions, func(v float64, _ *dto.Metric) { s.Preemptions += v }) ||
		each("vllm:num_preemptions", func(v float64, _ *dto.Metric) { s.Preemptions += v })
	s.HasOOM = each(metricSimOOM, func(v float64, _ *dto.Metric) { s.OOMEvents += v })
	s.HasKVPeak = each(metricSimKVPeak, func(v float64, _ *dto.Metric) { s.KVPeak = max(s.KVPeak, v) })
	s.Healthy = true
	// Every engine must be up for the server to be.
	s.HasHealthy = each(metricSimHealthy, func(v float64, _ *dto.Metric) { s.Healthy = s.Healthy && v > 0 })
	s.Healthy = s.Healthy && s.HasHealthy
	each(metricCacheConfig, func(_ float64, m *dto.Metric) {
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "num_gpu_blocks":
				if n, err := strconv.Atoi(l.GetValue()); err == nil {
					s.NumGPUBlocks += n
				}
			case "block_size":
				if n, err := strconv.Atoi(l.GetValue()); err == nil {
					s.BlockSize = n
				}
			}
		}
	})
	if samples == 0 {
		return s, errors.New("no Prometheus samples in the body")
	}
	return s, nil
}

// value is a sample's value, whatever its family's type.
func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return math.NaN() // a histogram or summary: none loadtest reads
}

// scrapeMetrics fetches and parses one /metrics page.
func scrapeMetrics(ctx context.Context, c *http.Client, url string, timeout time.Duration) (MetricsSample, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return MetricsSample{}, fmt.Errorf("metrics %s: %w", url, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return MetricsSample{}, fmt.Errorf("metrics %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsBody))
	if err != nil {
		return MetricsSample{}, fmt.Errorf("metrics %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return MetricsSample{}, fmt.Errorf("metrics %s: HTTP %d", url, resp.StatusCode)
	}
	s, err := ParseMetrics(body)
	if err != nil {
		return s, fmt.Errorf("metrics %s: %w", url, err)
	}
	return s, nil
}
