package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
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

// ParseMetrics reads the Prometheus text exposition format, keeping only the
// series loadtest uses. Lines it cannot read are skipped, not fatal: one odd
// metric from another library must not blind the memory curve. It reports an
// error only when the body holds no sample line at all.
func ParseMetrics(body []byte) (MetricsSample, error) {
	var s MetricsSample
	var kvNew, kvOld float64
	var hasNew, hasOld bool
	samples := 0
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, ok := parseSampleLine(line)
		if !ok {
			continue
		}
		samples++
		if math.IsNaN(value) {
			continue
		}
		switch name {
		case metricKVUsage:
			kvNew, hasNew = maxOr(kvNew, value, hasNew), true
		case metricGPUCache:
			kvOld, hasOld = maxOr(kvOld, value, hasOld), true
		case metricRunning:
			s.Running, s.HasRunning = s.Running+value, true
		case metricWaiting:
			s.Waiting, s.HasWaiting = s.Waiting+value, true
		case metricPreemptions, "vllm:num_preemptions":
			s.Preemptions, s.HasPreemptions = s.Preemptions+value, true
		case metricSimOOM:
			s.OOMEvents, s.HasOOM = s.OOMEvents+value, true
		case metricSimKVPeak:
			s.KVPeak, s.HasKVPeak = maxOr(s.KVPeak, value, s.HasKVPeak), true
		case metricSimHealthy:
			// Every engine must be up for the server to be.
			s.Healthy, s.HasHealthy = (s.Healthy || !s.HasHealthy) && value > 0, true
		case metricCacheConfig:
			if n, err := strconv.Atoi(labelValue(labels, "num_gpu_blocks")); err == nil {
				s.NumGPUBlocks += n
			}
			if n, err := strconv.Atoi(labelValue(labels, "block_size")); err == nil {
				s.BlockSize = n
			}
		}
	}
	if err := sc.Err(); err != nil {
		return s, fmt.Errorf("read metrics: %w", err)
	}
	switch {
	case hasNew:
		s.KVUsage, s.HasKV, s.KVSource = kvNew, true, metricKVUsage
	case hasOld:
		s.KVUsage, s.HasKV, s.KVSource = kvOld, true, metricGPUCache
	}
	if samples == 0 {
		return s, errors.New("no Prometheus samples in the body")
	}
	return s, nil
}

func maxOr(cur, v float64, have bool) float64 {
	if !have {
		return v
	}
	return max(cur, v)
}

// parseSampleLine splits `name{l="v",...} value [timestamp]`.
func parseSampleLine(line string) (name, labels string, value float64, ok bool) {
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return "", "", 0, false
	}
	name, rest := line[:i], line[i:]
	if rest[0] == '{' {
		end, found := labelsEnd(rest)
		if !found {
			return "", "", 0, false
		}
		labels, rest = rest[1:end], rest[end+1:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 || len(fields) > 2 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return "", "", 0, false
	}
	return name, labels, v, true
}

// labelsEnd finds the '}' closing a label set that starts at s[0] == '{',
// skipping braces inside quoted, backslash-escaped values.
func labelsEnd(s string) (int, bool) {
	inQuote := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i, true
		}
	}
	return 0, false
}

// labelValue returns the unescaped value of label key in a label set body.
func labelValue(labels, key string) string {
	for len(labels) > 0 {
		eq := strings.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return ""
		}
		k := strings.TrimSpace(strings.TrimLeft(labels[:eq], ", "))
		var b strings.Builder
		i := eq + 2
		for ; i < len(labels) && labels[i] != '"'; i++ {
			if labels[i] == '\\' && i+1 < len(labels) {
				i++
				switch labels[i] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(labels[i])
				}
				continue
			}
			b.WriteByte(labels[i])
		}
		if k == key {
			return b.String()
		}
		if i >= len(labels) {
			return ""
		}
		labels = labels[i+1:]
	}
	return ""
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
