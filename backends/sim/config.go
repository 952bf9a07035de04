package sim

import (
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/confval"
	"github.com/kvgate/kvgate/kvbudget"
)

// Defaults. The timings model Llama-3-8B in bf16 on one 24 GiB card of the
// RTX 4090 / L4 / A10 class; see doc.go for the arithmetic behind them.
const (
	DefaultModel                 = "llama-3-8b"
	DefaultGPUMemory       int64 = 24 << 30
	DefaultUtilization           = 0.9 // vLLM's --gpu-memory-utilization default
	DefaultMaxModelLen           = 8192
	DefaultMaxNumSeqs            = 256 // vLLM's --max-num-seqs default
	DefaultOOMRestart            = 2 * time.Second
	DefaultStepBase              = 15 * time.Millisecond
	DefaultStepPerSeq            = 150 * time.Microsecond
	DefaultPrefillPerToken       = 100 * time.Microsecond

	OverflowPreempt = "preempt"
	OverflowOOM     = "oom"
)

//go:embed llama-3-8b.json
var llama3Config []byte

// Config describes one simulated vLLM server. Every field's zero value means
// its default, except TimeScale (zero means the engine is free) and Seed
// (zero is a seed). Where a duration or size may also be switched off,
// a negative value means none.
//
// Use DefaultConfig for a server that runs in real time.
type Config struct {
	// Model is the served model name (vLLM's --served-model-name); requests
	// naming any other model get 404. "" means "llama-3-8b".
	Model string
	// Geometry is the model whose KV cache is simulated; nil means the
	// built-in Llama-3-8B (examples/llama-3-8b.json).
	Geometry *kvbudget.Model
	// GPUMemory is the simulated card's memory in bytes; 0 means 24 GiB.
	GPUMemory int64
	// GPUMemoryUtilization is the fraction of GPUMemory the server may use,
	// weights included, in (0, 1]; 0 means 0.9.
	GPUMemoryUtilization float64
	// WeightsBytes is the weight memory; 0 means Geometry's estimate at its
	// served dtype. Negative is an error.
	WeightsBytes int64
	// Reserve is activation and runtime memory; 0 means
	// kvbudget.DefaultReserve (1 GiB), negative means none.
	Reserve int64
	// BlockSize is tokens per KV block; 0 means 16.
	BlockSize int
	// MaxModelLen is the longest prompt+output in tokens; 0 means 8192, or
	// the model's max_position_embeddings when that is smaller.
	MaxModelLen int
	// MaxNumSeqs caps the running sequences (preempt mode); 0 means 256.
	MaxNumSeqs int
	// OnOverflow is OverflowPreempt ("" too) or OverflowOOM.
	OnOverflow string
	// OOMRestart is how long, in simulated time, the server is unhealthy
	// after an out-of-memory event; 0 means 2s, negative means none.
	OOMRestart time.Duration
	// StepBase + StepPerSeq × running sequences + PrefillPerToken × tokens
	// prefilled is the simulated duration of one engine step. 0 means the
	// default (15ms, 150µs, 100µs), negative means none.
	StepBase, StepPerSeq, PrefillPerToken time.Duration
	// TimeScale multiplies every simulated duration to get wall time: 1 is
	// real time, 0.01 is 100× faster, 0 makes the engine free (steps take no
	// time at all, for benchmarks of what is in front of it). Negative is an
	// error. Note that 0 is the zero value: Config{} is a free engine.
	TimeScale float64
	// OutputLen is how many tokens a sequence generates before it stops on
	// its own: "" means always max_tokens; otherwise "fixed:N",
	// "uniform:A-B", "normal:MEAN,STDDEV" or "lognormal:MEDIAN,SIGMA",
	// drawn per sequence and capped by max_tokens.
	OutputLen string
	// OutputLenWhen gives some requests other lengths, as a real model's
	// answers depend on what is asked: each entry is "TEXT=DIST", and a
	// request whose body contains TEXT draws its lengths from DIST (as
	// OutputLen) instead; the first entry that matches wins. A workload
	// can so change its lengths without a field a gateway could read.
	OutputLenWhen []string
	// DisablePrefixCaching turns vLLM's automatic prefix caching off (vLLM's
	// --no-enable-prefix-caching). false, the default as in vLLM V1, caches
	// full KV blocks by the hash of their prefix: a request whose leading
	// blocks are cached reuses them and does not prefill them again.
	DisablePrefixCaching bool
	// StreamInterval is how many tokens each SSE event of a stream
	// carries (vLLM's --stream-interval): an event goes out once that
	// many are generated, or the sequence ends. 0 means 1; negative is an
	// error.
	StreamInterval int
	// StreamMerge, when > 0, has each event carry a random number of
	// tokens from 1 to StreamMerge instead, as a vLLM whose API server
	// lags its engine merges the deltas it has not sent yet (drawn from
	// the sequence and the token, so reproducible). It cannot be set with
	// StreamInterval above 1; negative is an error.
	StreamMerge int
	// NoContinuousUsage has the server ignore stream_options'
	// continuous_usage_stats, as OpenAI-compatible servers other than
	// vLLM do: only the final usage chunk is sent. false, the default,
	// puts the cumulative usage on every chunk when asked, as vLLM does.
	NoContinuousUsage bool
	// RefuseContinuousUsage answers 400 to a request whose stream_options
	// name continuous_usage_stats at all, as OpenAI's API and proxies that
	// validate requests against it do ("Unrecognized request argument").
	// It implies NoContinuousUsage.
	RefuseContinuousUsage bool
	// NoTokenize answers /tokenize 404, as an OpenAI-compatible server
	// without vLLM's extras does (or an nginx in front that routes only
	// /v1): a gateway in front must count prompts without it.
	NoTokenize bool
	// HidePrefixCachingLabel leaves enable_prefix_caching out of
	// vllm:cache_config_info, as a vLLM-compatible server may that shares
	// prompt prefixes and says so only through its prefix-cache counters
	// (vllm:prefix_cache_queries_total and _hits_total, still reported).
	HidePrefixCachingLabel bool
	// KVEvents, if set, publishes the prefix cache's changes as vLLM's
	// --kv-events-config does; it needs prefix caching on.
	KVEvents *KVEventsConfig
	// Seed makes generated text and lengths reproducible: the same seed and
	// the same request give the same output, whatever else is running.
	Seed int64
	// Logger receives the server's log lines; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig is the zero Config in real time (TimeScale 1).
func DefaultConfig() Config { return Config{TimeScale: 1} }

// ConfigError is a Config field that cannot be used; Field is the Go field
// name, so that callers (the CLI) can name their own spelling of it.
type ConfigError struct {
	Field string
	Err   error
}

func (e *ConfigError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

func fieldErr(field, format string, a ...any) error {
	return &ConfigError{Field: field, Err: fmt.Errorf(format, a...)}
}

// settings is a Config with its defaults filled in and its derived values
// computed once: what the engine and the server actually run with.
type settings struct {
	model         string
	geometry      *kvbudget.Model
	layout        kvbudget.KVLayout
	gpuMemory     int64
	utilization   float64
	weights       int64
	reserve       int64
	kvBytes       int64
	numBlocks     int64
	watermark     int64 // blocks kept free at admission (vLLM's 1% watermark)
	blockSize     int
	maxModelLen   int
	maxNumSeqs    int
	oom           bool
	prefixCaching bool
	api           apiSettings
	pace          paceSettings
	outputLen     lengthDist
	outputWhen    []lengthRule
	seed          uint64
	logger        *slog.Logger
	maxPositions  int
	kvEvents      *KVEventsConfig
}

// apiSettings are how the server's answers read, where OpenAI-compatible
// servers differ (Config's fields of the same names).
type apiSettings struct {
	// streamInterval and streamMerge: tokens per event.
	streamInterval, streamMerge int
	continuousUsage             bool
	refuseContinuousUsage       bool
	noTokenize                  bool
	hideLabel                   bool // HidePrefixCachingLabel
}

// paceSettings are the engine's timing: a step's cost and the wall time a
// simulated second takes (timeScale; 0: none).
type paceSettings struct {
	oomRestart time.Duration
	stepBase   time.Duration
	stepPerSeq time.Duration
	prefillPer time.Duration
	timeScale  float64
}

// resolve fills in defaults, checks every field and computes the KV pool.
func (c Config) resolve() (*settings, error) {
	s := &settings{model: c.Model, geometry: c.Geometry, logger: c.Logger}
	if s.model == "" {
		s.model = DefaultModel
	}
	if s.geometry == nil {
		m, err := kvbudget.ParseModelConfig(llama3Config)
		if err != nil {
			return nil, fmt.Errorf("built-in Llama-3-8B config: %w", err)
		}
		s.geometry = m
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	s.gpuMemory = c.GPUMemory
	switch {
	case s.gpuMemory == 0:
		s.gpuMemory = DefaultGPUMemory
	case s.gpuMemory < 0:
		return nil, fieldErr("GPUMemory", "must be > 0 bytes, got %d", c.GPUMemory)
	}
	s.utilization = c.GPUMemoryUtilization
	if s.utilization == 0 {
		s.utilization = DefaultUtilization
	}
	if !(s.utilization > 0 && s.utilization <= 1) {
		return nil, fieldErr("GPUMemoryUtilization", "must be in (0, 1], got %g", c.GPUMemoryUtilization)
	}
	s.blockSize = c.BlockSize
	switch {
	case s.blockSize == 0:
		s.blockSize = kvbudget.DefaultBlockSize
	case s.blockSize < 0:
		return nil, fieldErr("BlockSize", "must be >= 1 token, got %d", c.BlockSize)
	}
	l, err := s.geometry.KVLayout(kvbudget.KVSpec{BlockSize: s.blockSize})
	if err != nil {
		return nil, fieldErr("Geometry", "%w", err)
	}
	s.layout = l
	s.weights = c.WeightsBytes
	switch {
	case s.weights == 0 && !s.geometry.WeightsKnown():
		return nil, fieldErr("WeightsBytes", "required: the model config lacks %s, which the weight estimate needs", strings.Join(s.geometry.WeightKeysMissing, ", "))
	case s.weights == 0:
		s.weights = s.geometry.WeightBytes(s.geometry.ServedDType())
	case s.weights < 0:
		return nil, fieldErr("WeightsBytes", "must be >= 0, got %d", c.WeightsBytes)
	}
	s.reserve = c.Reserve
	switch {
	case s.reserve == 0:
		s.reserve = kvbudget.DefaultReserve
	case s.reserve < 0:
		s.reserve = 0
	}
	s.maxPositions = s.geometry.MaxPositions
	s.maxModelLen = c.MaxModelLen
	switch {
	case s.maxModelLen == 0:
		s.maxModelLen = DefaultMaxModelLen
		if s.maxPositions > 0 && s.maxPositions < s.maxModelLen {
			s.maxModelLen = s.maxPositions
		}
	case s.maxModelLen < 2:
		return nil, fieldErr("MaxModelLen", "must be >= 2 tokens (one of prompt, one of output), got %d", c.MaxModelLen)
	case s.maxPositions > 0 && s.maxModelLen > s.maxPositions:
		// vLLM refuses a max_model_len beyond the model's positions too.
		return nil, fieldErr("MaxModelLen", "%d is greater than the model's max_position_embeddings %d", c.MaxModelLen, s.maxPositions)
	}
	s.maxNumSeqs = c.MaxNumSeqs
	switch {
	case s.maxNumSeqs == 0:
		s.maxNumSeqs = DefaultMaxNumSeqs
	case s.maxNumSeqs < 0:
		return nil, fieldErr("MaxNumSeqs", "must be >= 1, got %d", c.MaxNumSeqs)
	}
	switch c.OnOverflow {
	case "", OverflowPreempt:
	case OverflowOOM:
		s.oom = true
	default:
		return nil, fieldErr("OnOverflow", "must be %q or %q, got %q", OverflowPreempt, OverflowOOM, c.OnOverflow)
	}
	s.pace.oomRestart = confval.Or(c.OOMRestart, DefaultOOMRestart)
	s.pace.stepBase = confval.Or(c.StepBase, DefaultStepBase)
	s.pace.stepPerSeq = confval.Or(c.StepPerSeq, DefaultStepPerSeq)
	s.pace.prefillPer = confval.Or(c.PrefillPerToken, DefaultPrefillPerToken)
	if !(c.TimeScale >= 0) || c.TimeScale > 1e6 {
		return nil, fieldErr("TimeScale", "must be in [0, 1e6], got %g", c.TimeScale)
	}
	s.pace.timeScale = c.TimeScale
	switch {
	case c.StreamInterval < 0:
		return nil, fieldErr("StreamInterval", "must be >= 1 token an event (0: 1), got %d", c.StreamInterval)
	case c.StreamMerge < 0:
		return nil, fieldErr("StreamMerge", "must be >= 0 (0: off), got %d", c.StreamMerge)
	case c.StreamMerge > 0 && c.StreamInterval > 1:
		return nil, fieldErr("StreamMerge", "cannot be set with StreamInterval %d: one or the other", c.StreamInterval)
	}
	s.api.streamInterval, s.api.streamMerge = max(c.StreamInterval, 1), c.StreamMerge
	s.api.continuousUsage = !c.NoContinuousUsage && !c.RefuseContinuousUsage
	s.api.refuseContinuousUsage = c.RefuseContinuousUsage
	if s.outputLen, err = parseLengthDist(c.OutputLen); err != nil {
		return nil, &ConfigError{Field: "OutputLen", Err: err}
	}
	for _, r := range c.OutputLenWhen {
		text, dist, ok := strings.Cut(r, "=")
		if !ok || text == "" {
			return nil, fieldErr("OutputLenWhen", "%q is not TEXT=DIST", r)
		}
		d, err := parseLengthDist(dist)
		if err != nil {
			return nil, &ConfigError{Field: "OutputLenWhen", Err: err}
		}
		s.outputWhen = append(s.outputWhen, lengthRule{text: []byte(text), dist: d})
	}
	s.seed = uint64(c.Seed)
	s.prefixCaching = !c.DisablePrefixCaching
	s.api.noTokenize = c.NoTokenize
	s.api.hideLabel = c.HidePrefixCachingLabel
	if c.KVEvents != nil {
		if c.KVEvents.Endpoint == "" {
			return nil, fieldErr("KVEvents", "an endpoint is needed to publish KV events on")
		}
		if !s.prefixCaching {
			return nil, fieldErr("KVEvents", "KV events need prefix caching on")
		}
		kv := *c.KVEvents
		s.kvEvents = &kv
	}

	g := kvbudget.GPUBudget{Memory: s.gpuMemory, Ceiling: s.utilization, Weights: s.weights, Reserve: s.reserve}
	kv, err := g.KVBytes()
	if err != nil {
		if errors.Is(err, kvbudget.ErrWeightsDoNotFit) {
			return nil, &ConfigError{Field: "GPUMemory", Err: err}
		}
		return nil, fmt.Errorf("kv budget: %w", err)
	}
	s.kvBytes = kv
	s.numBlocks = l.CapacityOf(kv).Blocks
	s.watermark = int64(0.01 * float64(s.numBlocks))
	// vLLM refuses to start when the cache cannot hold one sequence of
	// max_model_len; the watermark is added so that such a sequence can
	// always be admitted into an empty cache.
	if need := kvbudget.Blocks(s.maxModelLen, s.blockSize); need > s.numBlocks-s.watermark {
		return nil, fieldErr("MaxModelLen", "one sequence of max_model_len %d tokens needs %d KV blocks, but the cache holds %d (%s of KV memory, %d kept free as watermark); lower the max model length or give the KV cache more memory",
			s.maxModelLen, need, s.numBlocks, kvbudget.FormatBytes(kv), s.watermark)
	}
	return s, nil
}

// scaled is d in wall time.
func (s *settings) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * s.pace.timeScale)
}
