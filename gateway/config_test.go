package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends/gpuinfo"
)

const minimal = `
models:
  - name: m
    config: ../examples/llama-3-8b.json
backends:
  - name: b
    url: http://127.0.0.1:8000
    models: [m]
    gpu_memory: 24GiB
`

func TestConfigDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal), ".")
	if err != nil {
		t.Fatal(err)
	}
	a := c.Admission
	if c.Listen != "127.0.0.1:8080" || a.Ceiling != 0.75 || a.Reserve.Bytes != 1<<30 || a.DefaultClass != "standard" ||
		a.PriorityHeader != "X-Priority" || len(a.Classes) != 3 || !*a.Classes[2].Sheddable || *a.Classes[1].Sheddable || !*a.Feedback.Enabled {
		t.Errorf("admission defaults: %+v", a)
	}
	m := c.Models[0]
	if m.TP != 1 || m.BlockSize != 16 || m.Tokenizer != "backend" || m.Estimate.TemplateTokens != 32 || m.Estimate.Margin != 0.05 {
		t.Errorf("model defaults: %+v", m)
	}
	if c.Backends[0].GPU != "b" || c.Server.MaxBodyBytes.Bytes != 8<<20 || c.Server.RequestTimeout.D != 10*time.Minute || c.Server.WriteTimeout.D != 11*time.Minute {
		t.Errorf("server/backend defaults: %+v %+v", c.Server, c.Backends[0])
	}
	// The model's context length comes from its config.json.
	s, err := New(c, Options{DisableProbes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.watch.Close()
	if got := s.rt.Load().models["m"].maxLen; got != 8192 {
		t.Errorf("max_model_len from max_position_embeddings: %d", got)
	}
}

// Every mistake names its field.
func TestConfigErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown key", "listen: x:1\nlisten_addr: y\n" + minimal, "listen_addr: unknown key (line 2)"},
		{"bad listen", "listen: nope\n" + minimal, "listen: \"nope\" is not host:port"},
		{"ceiling", "admission: {ceiling: 1.5}\n" + minimal, "admission.ceiling"},
		{"resumable epsilon", "admission: {resumable_epsilon: 0.5}\n" + minimal, "admission.resumable_epsilon: 0.5 is not in (0, 0.5)"},
		{"queue timeout", "admission: {queue: {timeout: soon}}\n" + minimal, "admission.queue.timeout: invalid duration \"soon\""},
		{"negative duration", "server: {read_timeout: -1s}\n" + minimal, "server.read_timeout: invalid duration"},
		{"reserve", "admission: {reserve: lots}\n" + minimal, "admission.reserve: invalid memory size"},
		{"class name", "admission: {classes: [{name: a}, {timeout: 1s}]}\n" + minimal, "admission.classes[1].name: required"},
		{"duplicate class", "admission: {classes: [{name: a}, {name: a}]}\n" + minimal, "admission.classes[1].name: duplicate"},
		{"default class", "admission: {default_class: vip}\n" + minimal, "admission.default_class: \"vip\""},
		{"feedback", "admission: {feedback: {decrease: 1}}\n" + minimal, "admission.feedback.decrease"},
		{"reconcile tolerance", "admission: {reconcile: {tolerance: 1}}\n" + minimal, "admission.reconcile.tolerance"},
		{"reconcile sustain", "admission: {reconcile: {sustain: -1s}}\n" + minimal, "admission.reconcile.sustain"},
		{"tenant class", "tenants: [{name: t, class: gold}]\n" + minimal, "tenants[0].class: \"gold\""},
		{"tenant share", "tenants: [{name: t, share: 2}]\n" + minimal, "tenants[0].share"},
		{"duplicate key", "tenants: [{name: t, api_keys: [k]}, {name: u, api_keys: [k]}]\n" + minimal, "tenants[1].api_keys[0]: key already belongs to tenant \"t\""},
		{"tenant key", "tenants: [{name: t, api_key: [k]}]\n" + minimal, "tenants[0].api_key: unknown key (line 1); the keys here are name, share, queue_share, api_keys, class"},
		{"class key", "admission: {classes: [{name: a, max_request: 3}]}\n" + minimal, "admission.classes[0].max_request: unknown key (line 1); the keys here are name, max_requests, max_bytes, timeout, sheddable"},
		{"no models", "backends: []\n", "models: at least one model"},
		{"model source", "models: [{name: m}]\nbackends: [{name: b, url: 'http://x:1', models: [m], gpu_memory: 24GiB}]\n", "models[0]: one of config"},
		{"tokenizer", strings.Replace(minimal, "config: ../examples/llama-3-8b.json", "config: x.json\n    tokenizer: bpe", 1), "models[0].tokenizer: \"bpe\""},
		{"geometry", "models: [{name: m, geometry: {layers: 0, kv_heads: 8, head_dim: 128}}]\nbackends: [{name: b, url: 'http://x:1', models: [m], gpu_memory: 24GiB}]\n", "models[0].geometry.layers"},
		{"backend model", strings.Replace(minimal, "models: [m]", "models: [other]", 1), "backends[0].models[0]: \"other\" is not one of models"},
		{"gpu memory", strings.Replace(minimal, "gpu_memory: 24GiB", "gpu_memory: -3GiB", 1), "backends[0].gpu_memory: memory size \"-3GiB\" is negative"},
		{"no gpu memory", strings.Replace(minimal, "    gpu_memory: 24GiB\n", "", 1), "backends[0].gpu_memory: required"},
		{"health interval", strings.Replace(minimal, "gpu_memory: 24GiB", "gpu_memory: 24GiB\n    health: {interval: 1}", 1), "backends[0].health.interval"},
		{"stream usage", strings.Replace(minimal, "gpu_memory: 24GiB", "gpu_memory: 24GiB\n    stream_usage: none", 1), `backends[0].stream_usage: "none" is not continuous or final`},
		{"log level", "log: {level: loud}\n" + minimal, "log.level"},
		{"health path", strings.Replace(minimal, "gpu_memory: 24GiB", "gpu_memory: 24GiB\n    health: {path: health}", 1), "backends[0].health.path: \"health\" must start with /"},
		{"metrics path", strings.Replace(minimal, "gpu_memory: 24GiB", "gpu_memory: 24GiB\n    metrics: {path: metrics}", 1), "backends[0].metrics.path"},
		{"write before request timeout", "server: {write_timeout: 1m, request_timeout: 5m}\n" + minimal, "server.write_timeout: 1m0s is shorter than server.request_timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), ".")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

// Problems found while building the runtime also name their field (a
// missing model config is found earlier, at load, with the rest).
func TestBuildErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"missing model config", strings.Replace(minimal, "../examples/llama-3-8b.json", "nope.json", 1), "gateway/nope.json does not exist (a relative path is read from the config file's directory) (line 4)"}, // found at load, by its full path
		{"weights do not fit", strings.Replace(minimal, "24GiB", "16GiB", 1), "backends[0]: gpu \"b\": weights do not fit"},
		{"tp not dividing", strings.Replace(minimal, "config: ../examples/llama-3-8b.json", "config: ../examples/llama-3-8b.json\n    tp: 3", 1), "models[0] (m): 32 attention heads are not divisible by tensor parallel size 3"},
		{"inline geometry needs weights", "models: [{name: m, geometry: {layers: 32, kv_heads: 8, head_dim: 128}}]\nbackends: [{name: b, url: 'http://x:1', models: [m], gpu_memory: 24GiB}]\n", "weights_bytes: required"},
		{"nvml without a gpu", strings.Replace(minimal, "gpu_memory: 24GiB", "gpu_memory: nvml", 1), "backends[0].gpu_memory: nvml: no NVIDIA GPU visible"},
		{"bad url", strings.Replace(minimal, "http://127.0.0.1:8000", "ftp://x", 1), "backends[0].url: \"ftp://x\": want http://host:port or https://host[:port]"},
	}
	noGPU := func() ([]gpuinfo.Device, error) { return nil, gpuinfo.ErrNoGPU }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml), ".")
			if err == nil {
				_, err = New(c, Options{DisableProbes: true, ProbeGPUs: noGPU})
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

// gpu_memory: nvml:N reads GPU N; shared GPUs share one budget, and the
// weights of every model on them are paid for.
func TestGPUGroupsAndNVML(t *testing.T) {
	y := `
models:
  - {name: a, config: ../examples/llama-3-8b.json}
  - {name: b, config: ../examples/llama-3-8b.json}
backends:
  - {name: x, url: 'http://127.0.0.1:8001', models: [a], gpu: card0, gpu_memory: 'nvml:1'}
  - {name: y, url: 'http://127.0.0.1:8002', models: [b], gpu: card0, gpu_memory: 'nvml:1'}
`
	probe := func() ([]gpuinfo.Device, error) {
		return []gpuinfo.Device{{Index: 0, Total: 24 << 30}, {Index: 1, Total: 80 << 30}}, nil
	}
	c, err := Parse([]byte(y), ".")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(c, Options{DisableProbes: true, ProbeGPUs: probe})
	if err != nil {
		t.Fatal(err)
	}
	defer s.watch.Close()
	rt := s.rt.Load()
	if len(rt.gpus) != 1 {
		t.Fatalf("%d budgets for one GPU", len(rt.gpus))
	}
	// 80 GiB × 0.75 − 2 × 16,060,522,496 − 1 GiB
	want := int64(float64(80<<30)*0.75) - 2*16060522496 - 1<<30
	if got := rt.gpus["card0"].nominal; got != want {
		t.Errorf("shared budget %d, want %d", got, want)
	}
	if rt.gpuOf[rt.upstreams.Backends()[0]] != rt.gpuOf[rt.upstreams.Backends()[1]] {
		t.Error("backends on one GPU have different budgets")
	}
}

func TestLoadFileResolvesRelativePaths(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile("../examples/llama-3-8b.json")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "model.json"), data, 0o644)
	y := strings.Replace(minimal, "../examples/llama-3-8b.json", "model.json", 1)
	p := filepath.Join(dir, "kvgate.yaml")
	os.WriteFile(p, []byte(y), 0o644)
	c, err := LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Path(c.Models[0].Config); got != filepath.Join(dir, "model.json") {
		t.Errorf("resolved to %s", got)
	}
	if _, err := LoadFile(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("a missing file loaded")
	}
}

// The example shipped for operators loads and builds.
func TestExampleConfig(t *testing.T) {
	c, err := LoadFile("../examples/kvgate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(c, Options{DisableProbes: true})
	if err != nil {
		t.Fatal(err)
	}
	s.watch.Close()
	if !s.rt.Load().auth || s.rt.Load().gpus["gpu0"].nominal != 2193088512 {
		t.Errorf("example: auth %v, budget %d", s.rt.Load().auth, s.rt.Load().gpus["gpu0"].nominal)
	}
}

// Each section's defaults fill what the file leaves out; a duration whose 0s
// means "none" keeps an explicit 0s.
func TestConfigSectionDefaults(t *testing.T) {
	tests := []struct {
		name, yaml string
		check      func(c *Config) bool
	}{
		{"server", "", func(c *Config) bool {
			s := c.Server
			return s.ReadTimeout.D == 30*time.Second && s.IdleTimeout.D == 2*time.Minute && s.MaxConnections == 10000 &&
				s.DrainTimeout() == 30*time.Second && s.DrainDelay.D == 5*time.Second && s.MaxHeaderBytes.Bytes == 16<<10 &&
				s.MaxSSELineBytes.Bytes == 4<<20
		}},
		{"drain_delay 0s is none", "server: {drain_delay: 0s}\n", func(c *Config) bool { return c.Server.DrainDelay.D == 0 }},
		{"request timeout 0s is the default", "server: {request_timeout: 0s}\n", func(c *Config) bool {
			return c.Server.RequestTimeout.D == 10*time.Minute && c.Server.WriteTimeout.D == 11*time.Minute
		}},
		{"write timeout follows request timeout", "server: {request_timeout: 1m}\n", func(c *Config) bool { return c.Server.WriteTimeout.D == 2*time.Minute }},
		{"admission", "", func(c *Config) bool {
			a := c.Admission
			return a.Mode == modeKV && a.MaxConcurrency == 16 && a.Reservation == "predicted" && a.resumes() && a.AbortHold.D == time.Second &&
				*a.Backfill.Enabled && a.epsilon() == 1e-4
		}},
		{"abort_hold 0s is none", "admission: {abort_hold: 0s}\n", func(c *Config) bool { return c.Admission.AbortHold.D == 0 }},
		{"default class without standard", "admission: {classes: [{name: a}, {name: b}, {name: c}]}\n", func(c *Config) bool {
			return c.Admission.DefaultClass == "b" && !*c.Admission.Classes[0].Sheddable
		}},
		{"tenant class", "tenants: [{name: t, api_keys: [k]}]\n", func(c *Config) bool { return c.Tenants[0].Class == "standard" }},
		{"routing and log", "", func(c *Config) bool {
			return c.Routing == routingLeastLoaded && c.SessionHeader == "X-Session-Id" && c.Log.Level == "info" &&
				c.Log.Format == "text" && *c.Log.Access
		}},
		{"model", "", func(c *Config) bool {
			m := c.Models[0]
			return m.TokenizeCache == 16384 && m.Estimate.PerMessageTokens == 16 && m.Estimate.ImageTokens == 0 && m.Estimate.CalibrationWindow == 256
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml+minimal), ".")
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Fatalf("defaults not as documented: %+v", c)
			}
		})
	}
}

// The admission section reaches the scheduler as written: classes, their
// defaults (admission.queue) and backfill are admission's own types; count
// mode bounds queues by requests alone; an explicit headroom of 0 is none.
func TestAdmissionConfigTranslation(t *testing.T) {
	tests := []struct {
		name, yaml string
		check      func(a admission.Config) bool
	}{
		{"queue limits are the classes' defaults", "admission: {queue: {max_requests: 7, max_bytes: 1GiB, timeout: 5s}, classes: [{name: standard, timeout: 2s}]}\n",
			func(a admission.Config) bool {
				d := a.ClassDefaults
				return d.MaxQueued == 7 && d.MaxQueuedBytes.Bytes == 1<<30 && d.QueueTimeout.D == 5*time.Second &&
					a.Classes[0].QueueTimeout.D == 2*time.Second && a.DefaultClass == "standard"
			}},
		{"count mode", "admission: {mode: count, reservation: predicted}\n", func(a admission.Config) bool {
			return a.ClassDefaults.MaxQueuedBytes.Bytes == -1 && a.Policy.Reservation == admission.WorstCase
		}},
		{"count mode keeps a byte bound given", "admission: {mode: count, queue: {max_bytes: 1KiB}}\n", func(a admission.Config) bool {
			return a.ClassDefaults.MaxQueuedBytes.Bytes == 1024
		}},
		{"tenants", "tenants: [{name: t, api_keys: [k], share: 0.5, queue_share: 0.25}]\n", func(a admission.Config) bool {
			return len(a.Tenants) == 1 && a.Tenants[0] == admission.TenantConfig{Name: "t", Share: 0.5, QueueShare: 0.25}
		}},
		{"backfill off", "admission: {backfill: {enabled: false, max_head_age: 3s}}\n", func(a admission.Config) bool {
			return !a.Backfill.IsEnabled() && a.Backfill.MaxHeadAge.D == 3*time.Second
		}},
		{"headroom 0 is none", "admission: {headroom: 0}\n", func(a admission.Config) bool { return a.Policy.Headroom < 0 }},
		{"preemption on by default", "", func(a admission.Config) bool { return a.Preemption.IsEnabled() }},
		{"preemption off, after", "admission: {preemption: {enabled: false, after: 50ms}}\n", func(a admission.Config) bool {
			return !a.Preemption.IsEnabled() && a.Preemption.After.D == 50*time.Millisecond
		}},
		{"resumable epsilon reaches the scheduler", "admission: {resumable_epsilon: 0.003}\n", func(a admission.Config) bool { return a.Policy.ResumableEpsilon == 0.003 }},
		{"headroom absent is admission's", "", func(a admission.Config) bool { return a.Policy.Headroom == 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml+minimal), ".")
			if err != nil {
				t.Fatal(err)
			}
			if a := admissionConfig(c, &Options{}); !tt.check(a) {
				t.Fatalf("admission config: %+v", a)
			}
		})
	}
}
