package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	if m.TP != 1 || m.BlockSize != 16 || m.Tokenizer != "backend" || m.Estimate.BytesPerToken != 4 || m.Estimate.Margin != 0.1 {
		t.Errorf("model defaults: %+v", m)
	}
	if c.Backends[0].GPU != "b" || c.Server.MaxBodyBytes.Bytes != 8<<20 || c.Server.requestTimeout() != 10*time.Minute || c.Server.writeTimeout() != 11*time.Minute {
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
		{"queue timeout", "admission: {queue: {timeout: soon}}\n" + minimal, "admission.queue.timeout: invalid duration \"soon\""},
		{"negative duration", "server: {read_timeout: -1s}\n" + minimal, "server.read_timeout: invalid duration"},
		{"reserve", "admission: {reserve: lots}\n" + minimal, "admission.reserve: invalid memory size"},
		{"class name", "admission: {classes: [{name: a}, {timeout: 1s}]}\n" + minimal, "admission.classes[1].name: required"},
		{"duplicate class", "admission: {classes: [{name: a}, {name: a}]}\n" + minimal, "admission.classes[1].name: duplicate"},
		{"default class", "admission: {default_class: vip}\n" + minimal, "admission.default_class: \"vip\""},
		{"feedback", "admission: {feedback: {decrease: 1}}\n" + minimal, "admission.feedback.decrease"},
		{"tenant class", "tenants: [{name: t, class: gold}]\n" + minimal, "tenants[0].class: \"gold\""},
		{"tenant share", "tenants: [{name: t, share: 2}]\n" + minimal, "tenants[0].share"},
		{"duplicate key", "tenants: [{name: t, api_keys: [k]}, {name: u, api_keys: [k]}]\n" + minimal, "tenants[1].api_keys[0]: key already belongs to tenant \"t\""},
		{"no models", "backends: []\n", "models: at least one model"},
		{"model source", "models: [{name: m}]\nbackends: [{name: b, url: 'http://x:1', models: [m], gpu_memory: 24GiB}]\n", "models[0]: one of config"},
		{"tokenizer", strings.Replace(minimal, "config: ../examples/llama-3-8b.json", "config: x.json\n    tokenizer: bpe", 1), "models[0].tokenizer: \"bpe\""},
		{"geometry", "models: [{name: m, geometry: {layers: 0, kv_heads: 8, head_dim: 128}}]\nbackends: [{name: b, url: 'http://x:1', models: [m], gpu_memory: 24GiB}]\n", "models[0].geometry.layers"},
		{"backend model", strings.Replace(minimal, "models: [m]", "models: [other]", 1), "backends[0].models[0]: \"other\" is not one of models"},
		{"gpu memory", strings.Replace(minimal, "gpu_memory: 24GiB", "gpu_memory: -3GiB", 1), "backends[0].gpu_memory: memory size \"-3GiB\" is negative"},
		{"no gpu memory", strings.Replace(minimal, "    gpu_memory: 24GiB\n", "", 1), "backends[0].gpu_memory: required"},
		{"health interval", strings.Replace(minimal, "gpu_memory: 24GiB", "gpu_memory: 24GiB\n    health: {interval: 1}", 1), "backends[0].health.interval"},
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

// Problems found while building the runtime also name their field.
func TestBuildErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"missing model config", strings.Replace(minimal, "../examples/llama-3-8b.json", "nope.json", 1), "models[0] (m): config nope.json: read model config"},
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
	if len(rt.groups) != 1 {
		t.Fatalf("%d budgets for one GPU", len(rt.groups))
	}
	// 80 GiB × 0.75 − 2 × 16,060,522,496 − 1 GiB
	want := int64(float64(80<<30)*0.75) - 2*16060522496 - 1<<30
	if got := rt.groups["card0"].nominal; got != want {
		t.Errorf("shared budget %d, want %d", got, want)
	}
	if rt.groupOf[rt.pool.Backends()[0]] != rt.groupOf[rt.pool.Backends()[1]] {
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
	if !s.rt.Load().auth || s.rt.Load().groups["gpu0"].nominal != 2193088512 {
		t.Errorf("example: auth %v, budget %d", s.rt.Load().auth, s.rt.Load().groups["gpu0"].nominal)
	}
}
