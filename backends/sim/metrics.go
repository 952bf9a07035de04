package sim

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names are vLLM's (V1 engine: labels model_name and engine), so
// that what scrapes vLLM scrapes the simulator unchanged. The kvsim_ ones
// are the simulator's own, named by Prometheus's conventions (vLLM's colons
// are its own; in new names colons are for recording rules).
// docs/METRICS.md lists them all; TestMetricsMatchDocs compares.
const (
	mRunning      = "vllm:num_requests_running"
	mWaiting      = "vllm:num_requests_waiting"
	mKVUsage      = "vllm:kv_cache_usage_perc"
	mGPUCache     = "vllm:gpu_cache_usage_perc" // vLLM's name before V1
	mPreemptions  = "vllm:num_preemptions_total"
	mPromptTokens = "vllm:prompt_tokens_total"
	mGenTokens    = "vllm:generation_tokens_total"
	mTTFT         = "vllm:time_to_first_token_seconds"
	mE2E          = "vllm:e2e_request_latency_seconds"
	mCacheConfig  = "vllm:cache_config_info"
	mSuccess      = "vllm:request_success_total"
	mCacheQueries = "vllm:prefix_cache_queries_total"
	mCacheHits    = "vllm:prefix_cache_hits_total"
	mOOMEvents    = "kvsim_oom_events_total"
	mPeakUsage    = "kvsim_kv_usage_peak_ratio"
	mGPUMemory    = "kvsim_gpu_memory_bytes"
	mUsedBlocks   = "kvsim_kv_cache_used_blocks"
	mPeakBlocks   = "kvsim_kv_cache_peak_used_blocks"
	mHealthy      = "kvsim_healthy"
)

// finishedReasons are vLLM's finished_reason values of
// vllm:request_success_total; every one exists from the start, as in vLLM.
var finishedReasons = []string{"stop", "length", "abort"}

// vLLM's own buckets for these two histograms.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
		20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
		120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// metrics is one Server's registry. Gauges and counters are read from the
// engine at scrape time, so the hot path pays nothing for them; the two
// latency histograms are observed when a request finishes. Latencies are
// wall-clock, as vLLM measures them: with TimeScale 0.01 they are 100×
// shorter than the simulated times.
type metrics struct {
	reg  *prometheus.Registry
	ttft prometheus.Histogram
	e2e  prometheus.Histogram
}

func newMetrics(s *settings, stats func() Stats) *metrics {
	labels := prometheus.Labels{"model_name": s.model, "engine": "0"}
	m := &metrics{reg: prometheus.NewRegistry()}
	m.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Name: mTTFT,
		Help: "Histogram of time to first token in seconds.", Buckets: ttftBuckets, ConstLabels: labels})
	m.e2e = prometheus.NewHistogram(prometheus.HistogramOpts{Name: mE2E,
		Help: "Histogram of e2e request latency in seconds.", Buckets: e2eBuckets, ConstLabels: labels})
	m.reg.MustRegister(m.ttft, m.e2e, newEngineCollector(s, labels, stats))
	return m
}

func (m *metrics) finished(r *request, now time.Time) {
	m.ttft.Observe(r.firstToken.Sub(r.arrival).Seconds())
	m.e2e.Observe(now.Sub(r.arrival).Seconds())
}

// engineCollector turns one Stats snapshot into every gauge and counter.
type engineCollector struct {
	stats   func() Stats
	numBlk  float64
	gpuMem  float64
	descs   map[string]*prometheus.Desc
	kinds   map[string]prometheus.ValueType
	infoDsc *prometheus.Desc
	success *prometheus.Desc
}

func newEngineCollector(s *settings, labels prometheus.Labels, stats func() Stats) *engineCollector {
	c := &engineCollector{stats: stats, numBlk: float64(s.numBlocks), gpuMem: float64(s.gpuMemory),
		descs: map[string]*prometheus.Desc{}, kinds: map[string]prometheus.ValueType{}}
	for _, d := range []struct {
		name, help string
		kind       prometheus.ValueType
	}{
		{mRunning, "Number of requests in model execution batches.", prometheus.GaugeValue},
		{mWaiting, "Number of requests waiting to be processed.", prometheus.GaugeValue},
		{mKVUsage, "KV-cache usage. 1 means 100 percent usage.", prometheus.GaugeValue},
		{mGPUCache, "GPU KV-cache usage. 1 means 100 percent usage (the name before vLLM V1).", prometheus.GaugeValue},
		{mPreemptions, "Cumulative number of preemption from the engine.", prometheus.CounterValue},
		{mPromptTokens, "Number of prefill tokens processed.", prometheus.CounterValue},
		{mGenTokens, "Number of generation tokens processed.", prometheus.CounterValue},
		{mCacheQueries, "Prefix cache queries, in terms of number of queried tokens.", prometheus.CounterValue},
		{mCacheHits, "Prefix cache hits, in terms of number of cached tokens.", prometheus.CounterValue},
		{mOOMEvents, "Simulated CUDA out-of-memory events (on-overflow oom).", prometheus.CounterValue},
		{mPeakUsage, "Highest KV-cache usage seen since start, 1 means 100 percent.", prometheus.GaugeValue},
		{mGPUMemory, "Memory of the simulated GPU in bytes.", prometheus.GaugeValue},
		{mUsedBlocks, "KV blocks held by running requests.", prometheus.GaugeValue},
		{mPeakBlocks, "Most KV blocks held at once since start.", prometheus.GaugeValue},
		{mHealthy, "1 when serving, 0 while restarting after an out-of-memory event.", prometheus.GaugeValue},
	} {
		c.descs[d.name] = prometheus.NewDesc(d.name, d.help, nil, labels)
		c.kinds[d.name] = d.kind
	}
	// vLLM's info metric: a gauge fixed at 1 whose labels are the cache
	// config (model_name added here so a scraper can tell models apart).
	info := prometheus.Labels{
		"block_size":             strconv.Itoa(s.blockSize),
		"num_gpu_blocks":         strconv.FormatInt(s.numBlocks, 10),
		"gpu_memory_utilization": strconv.FormatFloat(s.utilization, 'g', -1, 64),
		"cache_dtype":            "auto",
		"num_cpu_blocks":         "None",
		"enable_prefix_caching":  map[bool]string{false: "False", true: "True"}[s.prefixCaching],
	}
	if s.api.hideLabel {
		delete(info, "enable_prefix_caching")
	}
	for k, v := range labels {
		info[k] = v
	}
	c.infoDsc = prometheus.NewDesc(mCacheConfig, "Information of the LLMEngine CacheConfig", nil, info)
	c.success = prometheus.NewDesc(mSuccess, "Count of successfully processed requests.", []string{"finished_reason"}, labels)
	return c
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	ch <- c.infoDsc
	ch <- c.success
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	healthy := 0.0
	if st.Healthy {
		healthy = 1
	}
	usage := float64(st.UsedBlocks) / c.numBlk
	for name, v := range map[string]float64{
		mRunning: float64(st.Running), mWaiting: float64(st.Waiting),
		mKVUsage: usage, mGPUCache: usage,
		mPreemptions: float64(st.Preemptions), mPromptTokens: float64(st.PromptTokens),
		mGenTokens: float64(st.GenerationTokens), mOOMEvents: float64(st.OOMEvents),
		mCacheQueries: float64(st.PrefixCacheQueries), mCacheHits: float64(st.PrefixCacheHits),
		mPeakUsage: float64(st.PeakUsedBlocks) / c.numBlk, mGPUMemory: c.gpuMem,
		mUsedBlocks: float64(st.UsedBlocks), mPeakBlocks: float64(st.PeakUsedBlocks), mHealthy: healthy,
	} {
		ch <- prometheus.MustNewConstMetric(c.descs[name], c.kinds[name], v)
	}
	ch <- prometheus.MustNewConstMetric(c.infoDsc, prometheus.GaugeValue, 1)
	for i, n := range []int64{st.FinishedStop, st.FinishedLength, st.Aborted} {
		ch <- prometheus.MustNewConstMetric(c.success, prometheus.CounterValue, float64(n), finishedReasons[i])
	}
}
