package gateway

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kvgate/kvgate/kvbudget"
)

// ModelConfig is one served model.
type ModelConfig struct {
	Name string `yaml:"name"`
	// ServedName, when set, is the name clients send instead of Name (as
	// LiteLLM's model_name → model): the gateway forwards Name, the
	// backend's own, and gives ServedName back in every answer and in
	// /v1/models. Name itself is then not served. Default: Name.
	ServedName string `yaml:"served_name"`
	// Base makes this model a LoRA adapter of the model named Base (vLLM's
	// --lora-modules): it takes its base's geometry and every setting of
	// its KV cache, and counts only its own weights (WeightsBytes, default
	// none) on the GPUs that serve it, beside its base's. Requests for the
	// adapter and its base share the GPU's budget, as on the backend.
	Base string `yaml:"base"`
	// adapterOf is Base once validate has filled the adapter in from it.
	adapterOf string
	// Config is a Hugging Face config.json (or a directory holding one),
	// relative to this file. Either Config or Geometry is required.
	Config   string          `yaml:"config"`
	Geometry *GeometryConfig `yaml:"geometry"`
	// WeightsBytes overrides the weight bytes estimated from the config.
	WeightsBytes Size `yaml:"weights_bytes"`
	// TP is the tensor-parallel size of each backend serving it. Default 1.
	TP int `yaml:"tp"`
	// KVDType is the backend's --kv-cache-dtype. Default auto (the model's).
	KVDType string `yaml:"kv_dtype"`
	// BlockSize is the backend's KV block size in tokens. Default 16.
	BlockSize int `yaml:"block_size"`
	// MaxModelLen caps prompt + output tokens (400 beyond). Default: the
	// config's max_position_embeddings, else 8192.
	MaxModelLen int `yaml:"max_model_len"`
	// DefaultMaxTokens is the output a request without max_tokens is
	// reserved for. Default: max_model_len − prompt.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// Tokenizer is how prompt tokens are counted: backend (the backend's
	// /tokenize, exact; the estimate where it cannot answer) or estimate
	// (the byte bound, tightened by calibration: estimate.go). Default
	// backend.
	Tokenizer string `yaml:"tokenizer"`
	// TokenizeCache is how many /tokenize answers (tokenizer: backend) are
	// remembered, so that a prompt seen before is counted without a round
	// trip. Each entry takes about 64 bytes, whatever the prompt's length.
	// Default 16384; negative: no cache.
	TokenizeCache int            `yaml:"tokenize_cache"`
	Estimate      EstimateConfig `yaml:"estimate"`
}

// GeometryConfig gives a model's KV geometry inline instead of a config.json.
type GeometryConfig struct {
	Layers  int    `yaml:"layers"`
	KVHeads int    `yaml:"kv_heads"`
	HeadDim int    `yaml:"head_dim"`
	DType   string `yaml:"dtype"` // default bfloat16
	// MLA: one latent of HeadDim per layer and token, no K/V pair.
	MLA bool `yaml:"mla"`
}

// EstimateConfig tunes the estimate (estimate.go): the bound's template
// overhead, and how calibration earns a tighter count.
type EstimateConfig struct {
	// TemplateTokens is the chat template's overhead per prompt (BOS, the
	// generation prompt, a default system preamble). Default 32.
	TemplateTokens int `yaml:"template_tokens"`
	// PerMessageTokens is the chat template's overhead per message (its
	// header, role and end). Default 16.
	PerMessageTokens int `yaml:"per_message_tokens"`
	// PerToolTokens is the chat template's overhead per tool definition.
	// Default 32.
	PerToolTokens int `yaml:"per_tool_tokens"`
	// ImageTokens is charged for each non-text content part where it is
	// more than the largest image the model's config.json gives. Default:
	// the config's, else 16384 (a dynamic-resolution model's largest).
	ImageTokens int `yaml:"image_tokens"`
	// Margin is added on top of a calibrated estimate, as a fraction
	// (never past the bound). Default 0.05.
	Margin float64 `yaml:"margin"`
	// CalibrationWindow is how many recent answers calibration takes the
	// largest ratio of. Default 256.
	CalibrationWindow int `yaml:"calibration_window"`
	// CalibrationMin is how many answers calibration needs (since start,
	// or since an answer passed its estimate) before it tightens the
	// bound. Default 32.
	CalibrationMin int `yaml:"calibration_min"`
}

// maxTokenizeCache bounds models[].tokenize_cache.
const maxTokenizeCache = 1 << 24

// defaults fills the settings of a model that is not an adapter
// (configdefaults.go; an adapter takes its base's instead). max_model_len's
// default needs the model's config.json and is applied where it is read
// (model.go).
func (m *ModelConfig) defaults() { fillDefaults("models[]", m) }

// validateModels fills and checks the models, adapters last (from their
// bases); it returns the models' names, which backends refer to.
func (c *Config) validateModels(p *problems) (models map[string]bool) {
	if len(c.Models) == 0 {
		p.bad("models", "at least one model is required")
	}
	models = map[string]bool{}
	served := map[string]bool{} // the names clients send
	for i := range c.Models {
		m := &c.Models[i]
		f := fmt.Sprintf("models[%d]", i)
		p.name(models, f+".name", "model", m.Name)
		client, field := m.Name, f+".name"
		if m.ServedName != "" {
			client, field = m.ServedName, f+".served_name"
		}
		if served[client] {
			p.bad(field, "%q is already a name clients send for another model", client)
		}
		served[client] = true
		if m.Base != "" {
			continue // checked, and filled in from its base, below
		}
		m.defaults()
		m.check(p, f)
		if m.Config != "" {
			c.checkModelFile(p, f+".config", m.Config)
		}
	}
	c.fillAdapters(p)
	return models
}

// check reports the problems of a model that is not an adapter, its
// defaults filled; f is its path.
func (m *ModelConfig) check(p *problems, f string) {
	switch {
	case m.Config == "" && m.Geometry == nil:
		p.bad(f, "one of config (a config.json path) or geometry is required")
	case m.Config != "" && m.Geometry != nil:
		p.bad(f, "config and geometry are exclusive")
	}
	m.Geometry.check(p, f+".geometry")
	p.size(f+".weights_bytes", m.WeightsBytes)
	if m.TP < 0 {
		p.bad(f+".tp", "must be >= 1")
	}
	if m.BlockSize < 0 {
		p.bad(f+".block_size", "must be >= 1")
	}
	if m.MaxModelLen < 0 {
		p.bad(f+".max_model_len", "must be > 0")
	}
	if m.DefaultMaxTokens < 0 {
		p.bad(f+".default_max_tokens", "must be >= 0")
	}
	switch m.Tokenizer {
	case "backend", "estimate":
	default:
		p.bad(f+".tokenizer", "%q is not backend or estimate", m.Tokenizer)
	}
	if m.TokenizeCache > maxTokenizeCache {
		p.bad(f+".tokenize_cache", "%d entries is more than %d", m.TokenizeCache, maxTokenizeCache)
	}
	m.Estimate.check(p, f+".estimate")
}

// check checks an inline geometry (f), if given.
func (g *GeometryConfig) check(p *problems, f string) {
	if g == nil {
		return
	}
	if g.Layers <= 0 {
		p.bad(f+".layers", "must be > 0")
	}
	if g.KVHeads <= 0 && !g.MLA {
		p.bad(f+".kv_heads", "must be > 0")
	}
	if g.HeadDim <= 0 {
		p.bad(f+".head_dim", "must be > 0")
	}
	if g.DType != "" {
		if _, err := kvbudget.ParseDType(g.DType); err != nil {
			p.bad(f+".dtype", "%v", err)
		}
	}
}

// check checks a model's estimate section (f).
func (e EstimateConfig) check(p *problems, f string) {
	if e.Margin < 0 || e.Margin > 10 {
		p.bad(f+".margin", "%v is not in [0, 10]", e.Margin)
	}
	for _, k := range []struct {
		name string
		v    int
	}{{"template_tokens", e.TemplateTokens}, {"per_message_tokens", e.PerMessageTokens}, {"per_tool_tokens", e.PerToolTokens}, {"image_tokens", e.ImageTokens}} {
		if k.v < 0 {
			p.bad(f+"."+k.name, "%d is negative", k.v)
		}
	}
	if e.CalibrationWindow < 0 || e.CalibrationWindow > 1<<16 {
		p.bad(f+".calibration_window", "%d is not in [1, 65536]", e.CalibrationWindow)
	}
	if e.CalibrationMin < 0 || e.CalibrationMin > e.CalibrationWindow {
		p.bad(f+".calibration_min", "%d is not in [1, calibration_window]", e.CalibrationMin)
	}
}

// fillAdapters checks each LoRA adapter (models[].base) and fills it in
// from its base, checked and defaulted already: an adapter is its base's
// geometry and cache settings under its own names and weights.
func (c *Config) fillAdapters(p *problems) {
	index := map[string]int{}
	for i, m := range c.Models {
		index[m.Name] = i
	}
	for i := range c.Models {
		m := &c.Models[i]
		if m.Base == "" {
			continue
		}
		f := fmt.Sprintf("models[%d]", i)
		j, ok := index[m.Base]
		switch {
		case !ok:
			p.bad(f+".base", "%q is not one of the models", m.Base)
			continue
		case c.Models[j].Base != "":
			p.bad(f+".base", "%q is an adapter itself: an adapter's base must be a model", m.Base)
			continue
		case m.Config != "" || m.Geometry != nil || m.TP != 0 || m.KVDType != "" || m.BlockSize != 0 || m.MaxModelLen != 0:
			p.bad(f, "an adapter (base: %s) takes its base's config, geometry, tp, kv_dtype, block_size and max_model_len; set them on %s", m.Base, m.Base)
			continue
		}
		if m.WeightsBytes.Bytes < 0 {
			p.bad(f+".weights_bytes", "must be >= 0")
		}
		own := *m
		*m = c.Models[j]
		m.Name, m.ServedName, m.Base, m.adapterOf, m.WeightsBytes = own.Name, own.ServedName, own.Base, own.Base, own.WeightsBytes
		if own.DefaultMaxTokens != 0 {
			m.DefaultMaxTokens = own.DefaultMaxTokens
		}
	}
}

// checkModelFile reads a model's config.json (or the directory holding
// it) at load, so that a missing or broken one is reported with the rest,
// by its full path: a relative one is read from the config file's
// directory, which the operator may not expect.
func (c *Config) checkModelFile(p *problems, field, name string) {
	path, err := filepath.Abs(c.Path(name))
	if err != nil {
		path = c.Path(name)
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		p.bad(field, "%s does not exist (a relative path is read from the config file's directory)", path)
		return
	}
	if _, err := kvbudget.ReadModelConfig(os.DirFS(filepath.Dir(path)), filepath.Base(path)); err != nil {
		p.bad(field, "%s: %v", path, err)
	}
}
