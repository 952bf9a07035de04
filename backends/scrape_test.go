package backends

import (
	"strings"
	"testing"
	"time"
)

func TestParseMetrics(t *testing.T) {
	tests := []struct {
		name string
		text string
		want KVReport
	}{
		{
			name: "current vLLM names",
			text: `# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama-3-8b"} 0.42
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama-3-8b"} 7
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama-3-8b"} 3
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="llama-3-8b"} 12
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",gpu_memory_utilization="0.9",num_gpu_blocks="2888",num_cpu_blocks="0"} 1
`,
			want: KVReport{Usage: 0.42, HasUsage: true, Running: 7, Waiting: 3, Preemptions: 12, NumGPUBlocks: 2888, BlockSize: 16, GPUMemoryUtilization: 0.9},
		},
		{
			name: "prefix caching on",
			text: `vllm:cache_config_info{block_size="16",enable_prefix_caching="True",num_gpu_blocks="2888"} 1
`,
			want: KVReport{NumGPUBlocks: 2888, BlockSize: 16, PrefixCaching: true},
		},
		{
			name: "prefix caching off",
			text: `vllm:cache_config_info{block_size="16",enable_prefix_caching="False",num_gpu_blocks="2888"} 1
`,
			want: KVReport{NumGPUBlocks: 2888, BlockSize: 16},
		},
		{
			name: "prefix-cache counters without the label",
			text: `# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama-3-8b"} 4096
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="llama-3-8b"} 1024
vllm:cache_config_info{block_size="16",num_gpu_blocks="2888"} 1
`,
			want: KVReport{NumGPUBlocks: 2888, BlockSize: 16, PrefixQueries: 4096, PrefixHits: 1024, HasPrefixCounters: true},
		},
		{
			name: "older vLLM names, two models",
			text: `vllm:gpu_cache_usage_perc{model_name="a"} 0.1
vllm:gpu_cache_usage_perc{model_name="b"} 0.6
vllm:num_requests_running{model_name="a"} 1
vllm:num_requests_running{model_name="b"} 2
vllm:num_preemptions{model_name="a"} 5
`,
			want: KVReport{Usage: 0.6, HasUsage: true, Running: 3, Preemptions: 5},
		},
		{
			name: "not vLLM",
			text: "go_goroutines 12\n",
			want: KVReport{},
		},
	}
	at := time.Unix(100, 0)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMetrics(strings.NewReader(tt.text), at)
			if err != nil {
				t.Fatal(err)
			}
			tt.want.At = at
			if got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
			if got.HasPool() != (tt.want.NumGPUBlocks > 0) {
				t.Errorf("HasPool = %v", got.HasPool())
			}
		})
	}
	if _, err := ParseMetrics(strings.NewReader("vllm:x{ 1\n"), at); err == nil {
		t.Error("malformed exposition parsed without error")
	}
}
