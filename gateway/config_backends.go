package gateway

import (
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/kvbudget"
)

// BackendConfig is one upstream server.
type BackendConfig struct {
	Name   string   `yaml:"name"`
	URL    string   `yaml:"url"`
	Models []string `yaml:"models"`
	// GPU names the GPU (group) the backend runs on; backends with the same
	// GPU share one budget. Default: the backend's name.
	GPU string `yaml:"gpu"`
	// GPUMemory is the memory of one GPU of the backend: a size (24GiB), or
	// nvml / nvml:N to read local GPU N through NVML at load. Required
	// unless KVBudget is given.
	GPUMemory string `yaml:"gpu_memory"`
	// KVBudget gives the budget in bytes directly, overriding the computation
	// from gpu_memory.
	KVBudget Size `yaml:"kv_budget"`
	// GPUDevice is the device the GPU is on, for gpu_watch: an index (0)
	// or a UUID (GPU-...). Default: the index gpu_memory: nvml:N names,
	// else the source's only device when it has one.
	GPUDevice string `yaml:"gpu_device"`
	// OtherUsed is memory used on the GPU by other processes. Default 0.
	OtherUsed Size `yaml:"other_used"`
	// APIKey is sent to the backend as a bearer token. Default none.
	APIKey string `yaml:"api_key"`
	// TLS tunes an https:// url (tls.go): CA, server name, client
	// certificate. Default: the system's roots and the url's host. Refused
	// with an http:// url.
	TLS    *BackendTLSConfig `yaml:"tls"`
	Health HealthConfig      `yaml:"health"`
	Scrape ScrapeConfig      `yaml:"metrics"`
	// MaxConnections to the backend. Default 1024.
	MaxConnections int `yaml:"max_connections"`
	// FirstByteTimeout bounds the wait for a streamed request's first event
	// (vLLM sends it once prefill is done): past it the request gets 504
	// upstream_timeout, its reservation is released, and the timeout counts
	// towards the backend's circuit. Non-streamed answers arrive whole and
	// are bounded by server.request_timeout alone. Default 60s.
	FirstByteTimeout Duration `yaml:"first_byte_timeout"`
	// TokenizeTimeout bounds one /tokenize call; past it (or on any failure)
	// the prompt is estimated instead. Default 2s.
	TokenizeTimeout Duration `yaml:"tokenize_timeout"`
	// MaxConcurrency is its limit in admission mode count. Default
	// admission.max_concurrency.
	MaxConcurrency int `yaml:"max_concurrency"`
	// PrefixCaching says whether a prompt block that several running
	// requests share counts once on the backend's GPU: auto (the default)
	// when the backend reports prefix caching on (vLLM's
	// vllm:cache_config_info, enable_prefix_caching) or its prefix-cache
	// counters show hits in whole blocks of the model's size; on always
	// (the operator asserts it); off never. Either way, sharing stops when
	// the backend's hits show it did not share what the gateway counted.
	PrefixCaching string `yaml:"prefix_caching"`
	// StreamUsage is the usage a stream asks the backend for: continuous
	// (the default) asks for vLLM's stream_options.continuous_usage_stats
	// with include_usage, so that every chunk carries the backend's count;
	// final asks for include_usage alone, for a server or a validating
	// proxy that refuses vLLM's extension (OpenAI's API answers 400
	// "Unrecognized request argument"): streams are then counted by their
	// events, and by the bytes of their text once a final usage shows
	// events carrying several tokens.
	StreamUsage string `yaml:"stream_usage"`
	// KVEvents subscribes to the backend's KV events (vLLM's
	// --kv-events-config), to bind requests where their prompt is cached
	// (kvevents.go). Default none.
	KVEvents *KVEventsConfig `yaml:"kv_events"`
}

const (
	streamUsageContinuous = "continuous"
	streamUsageFinal      = "final"
)

const (
	prefixCachingAuto = "auto"
	prefixCachingOff  = "off"
	prefixCachingOn   = "on"
)

// HealthConfig is a backend's active health check and circuit.
type HealthConfig struct {
	Path     string   `yaml:"path"`     // default /health
	Interval Duration `yaml:"interval"` // default 1s
	Timeout  Duration `yaml:"timeout"`  // default 2s
	Failures int      `yaml:"failures"` // consecutive failures that open the circuit; default 3
	Cooldown Duration `yaml:"cooldown"` // before a circuit that timeouts opened lets requests try again; default 5s
}

// ScrapeConfig is a backend's /metrics scrape.
type ScrapeConfig struct {
	Path     string   `yaml:"path"`     // default /metrics; "-" disables
	Interval Duration `yaml:"interval"` // default 1s
}

// defaults fills what the gateway resolves of a backend: its GPU, then
// its table's rows (configdefaults.go). The defaults of its health check,
// scrape, connections and timeouts are backends.Spec's, filled where the
// backend is made (Spec.WithDefaults), so that a reload compares like with
// like.
func (b *BackendConfig) defaults() {
	if b.GPU == "" {
		b.GPU = b.Name
	}
	fillDefaults("backends[]", b)
}

// validateBackends fills and checks the backends against the models'
// names, then that every model has a backend.
func (c *Config) validateBackends(p *problems, models map[string]bool) {
	if len(c.Backends) == 0 {
		p.bad("backends", "at least one backend is required")
	}
	names := map[string]bool{}
	for i := range c.Backends {
		b := &c.Backends[i]
		f := fmt.Sprintf("backends[%d]", i)
		b.defaults()
		p.name(names, f+".name", "backend", b.Name)
		b.checkServes(p, f, models)
		b.checkMemory(p, f)
		b.checkProbes(p, f)
		b.checkLimits(p, f)
		b.KVEvents.check(p, f+".kv_events")
	}
	c.checkServed(p, models)
}

// checkServes checks the backend's url and models (of models' names).
func (b *BackendConfig) checkServes(p *problems, f string, models map[string]bool) {
	if b.URL == "" {
		p.bad(f+".url", "required")
	}
	if len(b.Models) == 0 {
		p.bad(f+".models", "at least one model is required")
	}
	for j, m := range b.Models {
		if !models[m] {
			p.bad(fmt.Sprintf("%s.models[%d]", f, j), "%q is not one of models", m)
		}
	}
}

// checkMemory checks what sizes the backend's GPU budget.
func (b *BackendConfig) checkMemory(p *problems, f string) {
	p.size(f+".kv_budget", b.KVBudget)
	p.size(f+".other_used", b.OtherUsed)
	if b.GPUMemory == "" && b.KVBudget.Bytes == 0 {
		p.bad(f+".gpu_memory", "required (a size such as 24GiB, or nvml[:index]) unless kv_budget is given")
	} else if b.GPUMemory != "" && !strings.HasPrefix(b.GPUMemory, "nvml") {
		if _, err := kvbudget.ParseMemory(b.GPUMemory); err != nil {
			p.bad(f+".gpu_memory", "%v", err)
		}
	}
}

// checkProbes checks the health check and the metrics scrape.
func (b *BackendConfig) checkProbes(p *problems, f string) {
	for _, pth := range []struct{ field, v string }{{f + ".health.path", b.Health.Path}, {f + ".metrics.path", b.Scrape.Path}} {
		if pth.v != "" && pth.v != "-" && !strings.HasPrefix(pth.v, "/") {
			p.bad(pth.field, "%q must start with /", pth.v)
		}
	}
	if b.Health.Path == "-" {
		p.bad(f+".health.path", "health checks cannot be disabled (only metrics.path takes -)")
	}
	p.dur(f+".health.interval", b.Health.Interval)
	p.dur(f+".health.timeout", b.Health.Timeout)
	p.dur(f+".health.cooldown", b.Health.Cooldown)
	p.dur(f+".metrics.interval", b.Scrape.Interval)
	if b.Health.Failures < 0 {
		p.bad(f+".health.failures", "must be >= 1")
	}
}

// checkLimits checks the backend's connections, timeouts, concurrency and
// its choices of usage and prefix caching.
func (b *BackendConfig) checkLimits(p *problems, f string) {
	if b.MaxConnections < 0 {
		p.bad(f+".max_connections", "must be >= 0")
	}
	p.dur(f+".first_byte_timeout", b.FirstByteTimeout)
	p.dur(f+".tokenize_timeout", b.TokenizeTimeout)
	if b.MaxConcurrency < 0 {
		p.bad(f+".max_concurrency", "must be >= 1")
	}
	if b.StreamUsage != streamUsageContinuous && b.StreamUsage != streamUsageFinal {
		p.bad(f+".stream_usage", "%q is not continuous or final", b.StreamUsage)
	}
	switch b.PrefixCaching {
	case prefixCachingAuto, prefixCachingOn, prefixCachingOff:
	default:
		p.bad(f+".prefix_caching", "%q is not auto, on or off", b.PrefixCaching)
	}
}

// check checks a backend's kv_events (f), if given.
func (kv *KVEventsConfig) check(p *problems, f string) {
	if kv == nil {
		return
	}
	for _, e := range []struct{ field, v string }{{f + ".endpoint", kv.Endpoint}, {f + ".replay_endpoint", kv.Replay}} {
		if e.v == "" && e.field == f+".endpoint" {
			p.bad(e.field, "required: the publisher's address, e.g. tcp://10.0.0.5:5557")
		} else if e.v != "" && !strings.HasPrefix(e.v, "tcp://") && !strings.HasPrefix(e.v, "ipc://") {
			p.bad(e.field, "%q is not a tcp:// or ipc:// address", e.v)
		}
	}
	p.dur(f+".retry", kv.Retry)
}

// checkServed reports each model no backend serves.
func (c *Config) checkServed(p *problems, models map[string]bool) {
	for m := range models {
		served := false
		for _, b := range c.Backends {
			for _, bm := range b.Models {
				served = served || bm == m
			}
		}
		if !served && m != "" {
			p.bad("models", "model %q is served by no backend", m)
		}
	}
}

// maxConcurrency is the backend's limit in admission mode count.
func (b BackendConfig) maxConcurrency(a AdmissionConfig) int {
	if b.MaxConcurrency > 0 {
		return b.MaxConcurrency
	}
	return a.MaxConcurrency
}
