package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/kvgate/kvgate/kvbudget"
)

// model is a served model resolved from its config: what one request of it
// costs in KV bytes, and how its prompts are counted.
type model struct {
	name       string
	servedName string // what clients send and see (served_name, else name)
	layout     kvbudget.KVLayout
	weights    int64 // the whole model; each GPU of a TP group holds weights/TP
	maxLen     int
	defaultMax int
	tokenizer  string // "backend" or "estimate"
	est        *estimator
	tokens     *tokenCache // /tokenize answers; nil unless tokenizer is backend with a cache
	// converted is set once the backend's usage showed a Responses or
	// Messages prompt, counted by /tokenize as the chat request it converts
	// to, longer than that count: the backend converts otherwise than the
	// gateway does, and such prompts are estimated from then on.
	converted *atomic.Bool
	// kvEvents says a backend of the model publishes KV events: then a
	// prompt's chain is worth its token ids even where no GPU shares.
	kvEvents bool
}

func buildModel(c *Config, mc ModelConfig, prev *model) (*model, error) {
	var km *kvbudget.Model
	if mc.Config != "" {
		p := c.Path(mc.Config)
		var err error
		km, err = kvbudget.ReadModelConfig(os.DirFS(filepath.Dir(p)), filepath.Base(p))
		if err != nil {
			// The resolved path: a relative one is read from the config
			// file's directory, which the operator may not expect.
			return nil, fmt.Errorf("config %s: %w", p, err)
		}
	} else {
		g := mc.Geometry
		dt := kvbudget.BFloat16
		if g.DType != "" {
			dt, _ = kvbudget.ParseDType(g.DType)
		}
		km = &kvbudget.Model{Layers: g.Layers, KVHeads: max(g.KVHeads, 1), Heads: max(g.KVHeads, 1) * mc.TP, HeadDim: g.HeadDim, DType: dt}
		if g.MLA {
			km.MLA = &kvbudget.MLA{KVLoraRank: g.HeadDim}
			km.KVHeads = 1
		}
		if mc.WeightsBytes.Bytes == 0 && mc.adapterOf == "" {
			return nil, fmt.Errorf("weights_bytes: required with an inline geometry (there is no config to estimate them from)")
		}
	}
	l, err := km.KVLayout(kvbudget.KVSpec{TP: mc.TP, KVDType: mc.KVDType, BlockSize: mc.BlockSize})
	if err != nil {
		return nil, err
	}
	m := &model{name: mc.Name, layout: l, tokenizer: mc.Tokenizer, defaultMax: mc.DefaultMaxTokens, kvEvents: publishesKVEvents(c, mc.Name)}
	m.weights = mc.WeightsBytes.Bytes
	if mc.adapterOf != "" {
		// A LoRA adapter's weights are its own alone: its base's are
		// counted once, by the base.
		m.weights = max(m.weights, 0)
	} else if m.weights == 0 && !km.WeightsKnown() {
		return nil, fmt.Errorf("weights_bytes: required: the model config lacks %s, which the weight estimate needs", strings.Join(km.WeightKeysMissing, ", "))
	}
	if m.weights == 0 && mc.adapterOf == "" {
		m.weights = km.WeightBytes(km.ServedDType())
	}
	m.maxLen = mc.MaxModelLen
	if m.maxLen == 0 {
		m.maxLen = km.MaxPositions
	}
	if m.maxLen == 0 {
		m.maxLen = defaultMaxModelLen
	}
	e := mc.Estimate
	// An image is the largest the model's config allows, or the configured
	// image_tokens where that is more; neither said: the largest image of a
	// dynamic-resolution model (Qwen2-VL's default max_pixels).
	images := max(km.ImageTokens, e.ImageTokens)
	if images == 0 {
		images = defaultImageTokens
	}
	if prev != nil && prev.est != nil && prev.est.sameConfig(e, images) {
		m.est = prev.est // keep what calibration has learnt across reloads
	} else {
		m.est = newEstimator(e, images)
	}
	m.converted = new(atomic.Bool)
	if prev != nil && prev.converted != nil {
		m.converted = prev.converted
	}
	if m.tokenizer == "backend" && mc.TokenizeCache > 0 {
		if prev != nil && prev.tokens != nil && prev.tokens.capacity == mc.TokenizeCache {
			m.tokens = prev.tokens // same model name, same backends' tokenizer: what it learnt holds
		} else {
			m.tokens = newTokenCache(mc.TokenizeCache)
		}
	}
	return m, nil
}

// weightsPerGPU is what one GPU of the model's TP group holds.
func (m *model) weightsPerGPU() int64 { return m.weights / int64(m.layout.TP) }
