package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/kvbudget"
)

// simShutdownGrace is how long in-flight requests may run on after SIGINT or
// SIGTERM before they are failed.
const simShutdownGrace = 10 * time.Second

// simFlagOf names the flag behind each sim.Config field, for error messages.
var simFlagOf = map[string]string{
	"Model": "--model", "Geometry": "--model-config", "GPUMemory": "--gpu-memory",
	"GPUMemoryUtilization": "--gpu-memory-utilization", "WeightsBytes": "--weights-bytes", "Reserve": "--reserve",
	"BlockSize": "--block-size", "MaxModelLen": "--max-model-len", "MaxNumSeqs": "--max-num-seqs",
	"OnOverflow": "--on-overflow", "OOMRestart": "--oom-restart", "StepBase": "--step-base",
	"StepPerSeq": "--step-per-seq", "PrefillPerToken": "--prefill-per-token", "TimeScale": "--time-scale",
	"OutputLen": "--output-len", "OutputLenWhen": "--output-len-when", "DisablePrefixCaching": "--enable-prefix-caching",
	"StreamInterval": "--stream-interval", "StreamMerge": "--stream-merge", "NoContinuousUsage": "--continuous-usage",
	"NoTokenize": "--no-tokenize", "RefuseContinuousUsage": "--refuse-continuous-usage",
	"HidePrefixCachingLabel": "--hide-prefix-caching-label",
	"KVEvents":               "--kv-events-config",
}

// simFlags are the flags of kvgate sim, parsed into a sim.Config.
type simFlags struct {
	listen, model, modelConfig, onOverflow, outputLen string
	kvEvents                                          string
	outputLenWhen                                     stringList
	gpuMemory, weights, reserve                       sizeFlag
	utilization, timeScale                            float64
	blockSize, maxModelLen, maxNumSeqs                int
	streamInterval, streamMerge                       int
	continuousUsage                                   bool
	oomRestart, stepBase, stepPerSeq, prefillPer      time.Duration
	seed                                              int64
	prefixCaching, noTokenize, hideLabel              bool
	refuseContinuousUsage                             bool
}

func (f *simFlags) register(fs *flag.FlagSet) {
	f.gpuMemory.gpu = true
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8000", "`address` to serve vLLM's OpenAI API on (port 0: any free port)")
	fs.StringVar(&f.model, "model", sim.DefaultModel, "served model `name`; requests naming another model get 404")
	fs.StringVar(&f.modelConfig, "model-config", "", "Hugging Face `config.json` (or its directory) whose KV geometry to simulate (default: built-in Llama-3-8B)")
	fs.Var(&f.gpuMemory, "gpu-memory", "memory of the simulated GPU: 24GiB, 80GB (decimal), 24G (read as GiB) (default 24GiB)")
	fs.Float64Var(&f.utilization, "gpu-memory-utilization", sim.DefaultUtilization, "fraction of GPU memory the server may use, weights included, in (0, 1] (vLLM's meaning)")
	fs.Var(&f.weights, "weights-bytes", "weight memory, e.g. 15GiB (default: estimated from the model config)")
	fs.Var(&f.reserve, "reserve", "activation and runtime memory kept aside (default 1GiB)")
	fs.IntVar(&f.blockSize, "block-size", kvbudget.DefaultBlockSize, "KV block size in tokens")
	fs.IntVar(&f.maxModelLen, "max-model-len", 0, "longest prompt + output in tokens (default 8192, or the model's max_position_embeddings if smaller)")
	fs.IntVar(&f.maxNumSeqs, "max-num-seqs", sim.DefaultMaxNumSeqs, "most sequences running at once")
	fs.StringVar(&f.onOverflow, "on-overflow", sim.OverflowPreempt, "when the KV cache runs out: preempt (recompute the newest request, as vLLM) or oom (fail everything in flight with CUDA out of memory)")
	fs.DurationVar(&f.oomRestart, "oom-restart", sim.DefaultOOMRestart, "simulated time the server is unhealthy after an out-of-memory event")
	fs.DurationVar(&f.stepBase, "step-base", sim.DefaultStepBase, "simulated time of one engine step, before its sequences")
	fs.DurationVar(&f.stepPerSeq, "step-per-seq", sim.DefaultStepPerSeq, "simulated time each running sequence adds to a step")
	fs.DurationVar(&f.prefillPer, "prefill-per-token", sim.DefaultPrefillPerToken, "simulated time each prompt token adds to the step that prefills it")
	fs.Float64Var(&f.timeScale, "time-scale", 1, "wall time per simulated time: 0.01 runs 100× faster, 0 makes the engine free")
	fs.StringVar(&f.outputLen, "output-len", "", "output length distribution capped by max_tokens: fixed:N, uniform:A-B, normal:MEAN,STDDEV, lognormal:MEDIAN,SIGMA (default: always max_tokens)")
	fs.Var(&f.outputLenWhen, "output-len-when", "`TEXT=DIST`: requests whose body contains TEXT draw their output lengths from DIST instead (repeatable; the first that matches wins)")
	fs.Int64Var(&f.seed, "seed", 0, "seed of the generated text and output lengths")
	fs.IntVar(&f.streamInterval, "stream-interval", 1, "tokens each SSE event of a stream carries (vLLM's --stream-interval)")
	fs.IntVar(&f.streamMerge, "stream-merge", 0, "when > 0, each SSE event carries a random 1 to N tokens, as a vLLM whose API server lags its engine (not with --stream-interval)")
	fs.BoolVar(&f.continuousUsage, "continuous-usage", true, "honour stream_options.continuous_usage_stats, usage on every chunk, as vLLM does (=false: as servers without it)")
	fs.BoolVar(&f.refuseContinuousUsage, "refuse-continuous-usage", false, "answer 400 to stream_options.continuous_usage_stats, as OpenAI's API and proxies that validate against it do")
	fs.BoolVar(&f.noTokenize, "no-tokenize", false, "answer /tokenize 404, as a server without it (or a proxy that routes only /v1) does")
	fs.StringVar(&f.kvEvents, "kv-events-config", "", `publish the prefix cache's changes as vLLM does, given vLLM's `+"`JSON`"+`: {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv", "buffer_steps": 10000}; "encoding": "map" writes maps instead of vLLM's arrays`)
	fs.BoolVar(&f.prefixCaching, "enable-prefix-caching", true, "reuse the KV blocks of prompt prefixes already computed, as vLLM V1 does (=false: every prompt is prefilled whole)")
	fs.BoolVar(&f.hideLabel, "hide-prefix-caching-label", false, "leave enable_prefix_caching out of vllm:cache_config_info, as a server that reports sharing only through its prefix-cache hit counters")
}

// config checks what only the command line can get wrong and builds the
// Config; sim.New checks the rest.
func (f *simFlags) config(logger *slog.Logger) (sim.Config, error) {
	c := sim.Config{
		Model: f.model, GPUMemoryUtilization: f.utilization, BlockSize: f.blockSize, MaxModelLen: f.maxModelLen,
		MaxNumSeqs: f.maxNumSeqs, OnOverflow: f.onOverflow, TimeScale: f.timeScale, OutputLen: f.outputLen, OutputLenWhen: f.outputLenWhen,
		Seed: f.seed, DisablePrefixCaching: !f.prefixCaching, NoTokenize: f.noTokenize, HidePrefixCachingLabel: f.hideLabel, Logger: logger,
		StreamInterval: f.streamInterval, StreamMerge: f.streamMerge, NoContinuousUsage: !f.continuousUsage,
		RefuseContinuousUsage: f.refuseContinuousUsage,
	}
	if _, _, err := net.SplitHostPort(f.listen); err != nil {
		return c, fmt.Errorf("--listen %q: %w", f.listen, err)
	}
	if f.model == "" {
		return c, errors.New("--model must not be empty")
	}
	// In sim.Config zero means "the default"; on the command line the
	// defaults are the flags' own, so a 0 given here means zero.
	for _, n := range []struct {
		name string
		v    int
	}{{"--block-size", f.blockSize}, {"--max-num-seqs", f.maxNumSeqs}, {"--stream-interval", f.streamInterval}} {
		if n.v < 1 {
			return c, fmt.Errorf("%s must be >= 1, got %d", n.name, n.v)
		}
	}
	if f.maxModelLen < 0 {
		return c, fmt.Errorf("--max-model-len must be >= 2 tokens, got %d", f.maxModelLen)
	}
	if f.utilization <= 0 || f.utilization > 1 {
		return c, fmt.Errorf("--gpu-memory-utilization must be in (0, 1], got %g", f.utilization)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		dst  *time.Duration
	}{
		{"--oom-restart", f.oomRestart, &c.OOMRestart}, {"--step-base", f.stepBase, &c.StepBase},
		{"--step-per-seq", f.stepPerSeq, &c.StepPerSeq}, {"--prefill-per-token", f.prefillPer, &c.PrefillPerToken},
	} {
		switch {
		case d.v < 0:
			return c, fmt.Errorf("%s must be >= 0, got %v", d.name, d.v)
		case d.v == 0:
			*d.dst = -1 // none
		default:
			*d.dst = d.v
		}
	}
	if f.gpuMemory.set {
		if f.gpuMemory.size.Bytes <= 0 {
			return c, fmt.Errorf("--gpu-memory must be > 0, got %s", f.gpuMemory.raw)
		}
		c.GPUMemory = f.gpuMemory.size.Bytes
	}
	if f.weights.set {
		if f.weights.size.Bytes <= 0 {
			return c, fmt.Errorf("--weights-bytes must be > 0, got %s (leave it out to estimate the weights from the model)", f.weights.raw)
		}
		c.WeightsBytes = f.weights.size.Bytes
	}
	if f.reserve.set {
		c.Reserve = f.reserve.size.Bytes
		if c.Reserve == 0 {
			c.Reserve = -1 // none
		}
	}
	if f.kvEvents != "" {
		kv, err := parseKVEventsConfig(f.kvEvents)
		if err != nil {
			return c, fmt.Errorf("--kv-events-config: %w", err)
		}
		c.KVEvents = kv
	}
	if f.modelConfig != "" {
		m, err := loadModel(f.modelConfig)
		if err != nil {
			return c, err
		}
		c.Geometry = m
	}
	return c, nil
}

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("sim", "[--listen 127.0.0.1:8000] [--gpu-memory 24GiB] [--on-overflow preempt|oom] [--time-scale 1] [flags]", stdout, stderr)
	var f simFlags
	f.register(fs)
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	cfg, err := f.config(logger)
	if err != nil {
		return fail(stderr, "sim", exitUsage, "%v", err)
	}
	srv, err := sim.New(cfg)
	if err != nil {
		if ce, ok := errors.AsType[*sim.ConfigError](err); ok {
			if name, ok := simFlagOf[ce.Field]; ok {
				return fail(stderr, "sim", exitUsage, "%s: %v", name, ce.Err)
			}
		}
		return fail(stderr, "sim", exitUsage, "%v", err)
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		_ = srv.Shutdown(context.Background())
		return fail(stderr, "sim", exitNo, "listen: %v", err)
	}
	st := srv.Stats()
	fmt.Fprintf(stdout, "kvgate sim: serving %s on http://%s, KV cache %d blocks of %d tokens = %d tokens, on overflow %s\n",
		f.model, ln.Addr(), st.NumGPUBlocks, st.BlockSize, st.NumGPUBlocks*int64(st.BlockSize), f.onOverflow)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		_ = srv.Shutdown(context.Background())
		return fail(stderr, "sim", exitNo, "serve: %v", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down", "grace", simShutdownGrace)
	sctx, cancel := context.WithTimeout(context.Background(), simShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		logger.Warn("requests still running after the grace period were failed", "err", err)
	}
	if err := <-served; err != nil {
		return fail(stderr, "sim", exitNo, "serve: %v", err)
	}
	return exitOK
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// parseKVEventsConfig reads vLLM's --kv-events-config JSON (its
// KVEventsConfig): nil when events are not enabled.
func parseKVEventsConfig(s string) (*sim.KVEventsConfig, error) {
	var v struct {
		Enable      bool   `json:"enable_kv_cache_events"`
		Publisher   string `json:"publisher"`
		Endpoint    string `json:"endpoint"`
		Replay      string `json:"replay_endpoint"`
		Topic       string `json:"topic"`
		BufferSteps int    `json:"buffer_steps"`
		Encoding    string `json:"encoding"`
	}
	v.Endpoint = "tcp://*:5557" // vLLM's default
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not vLLM's KV events JSON: %w", err)
	}
	if !v.Enable {
		return nil, nil
	}
	if v.Publisher != "" && v.Publisher != "zmq" {
		return nil, fmt.Errorf("publisher %q: only zmq is simulated", v.Publisher)
	}
	if v.Encoding != "" && v.Encoding != "map" && v.Encoding != "positional" {
		return nil, fmt.Errorf("encoding %q is not map or positional", v.Encoding)
	}
	if v.BufferSteps < 0 {
		return nil, fmt.Errorf("buffer_steps must be >= 0, got %d", v.BufferSteps)
	}
	return &sim.KVEventsConfig{Endpoint: v.Endpoint, ReplayEndpoint: v.Replay, Topic: v.Topic,
		BufferSteps: v.BufferSteps, MapEncoding: v.Encoding == "map"}, nil
}
