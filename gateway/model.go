package gateway

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"

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
	m := &model{name: mc.Name, layout: l, tokenizer: mc.Tokenizer, defaultMax: mc.DefaultMaxTokens}
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
	if prev != nil && prev.est != nil && prev.est.sameConfig(e) {
		m.est = prev.est // keep what calibration has learnt across reloads
	} else {
		m.est = newEstimator(e)
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

// estimator predicts prompt tokens from text bytes. It starts from a
// configured bytes-per-token ratio and calibrates continuously against the
// prompt token counts backends report in usage, so that it converges on the
// backend's real tokenizer; the margin keeps predictions on the safe side of
// the noise.
type estimator struct {
	cfg EstimateConfig

	mu            sync.Mutex // guards the fields below
	tokensPerByte float64
	samples       int
}

func newEstimator(c EstimateConfig) *estimator {
	return &estimator{cfg: c, tokensPerByte: 1 / c.BytesPerToken}
}

func (e *estimator) sameConfig(c EstimateConfig) bool { return e.cfg == c }

// promptShape is what an estimate needs to know of a prompt.
type promptShape struct {
	textBytes int // bytes of text content
	messages  int // chat messages (template overhead each)
	images    int // non-text content parts
	tokenIDs  int // tokens given as ids: exact
	ids       bool
}

func (e *estimator) overhead(s promptShape) int {
	return s.messages*e.cfg.PerMessageTokens + s.images*e.cfg.ImageTokens + s.tokenIDs
}

// predict returns the estimated prompt tokens for s.
func (e *estimator) predict(s promptShape) int {
	e.mu.Lock()
	r := e.tokensPerByte
	e.mu.Unlock()
	return int(math.Ceil(float64(s.textBytes)*r*(1+e.cfg.Margin))) + e.overhead(s)
}

// observe feeds back the backend's count for a prompt of shape s.
// The weight of a sample starts high (the first answers move the ratio
// most) and settles at 1/20, an exponential average over recent traffic.
func (e *estimator) observe(s promptShape, actual int) {
	text := actual - e.overhead(s)
	if s.textBytes < 16 || text <= 0 {
		return // too small to say anything about the ratio
	}
	ratio := float64(text) / float64(s.textBytes)
	e.mu.Lock()
	e.samples++
	alpha := max(1/float64(e.samples), 0.05)
	e.tokensPerByte += alpha * (ratio - e.tokensPerByte)
	e.mu.Unlock()
}

// bytesPerToken is the current calibrated ratio, for the status view.
func (e *estimator) bytesPerToken() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return 1 / e.tokensPerByte
}
