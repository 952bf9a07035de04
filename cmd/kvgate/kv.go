package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/kvgate/kvgate/kvbudget"
)

// kvReport is the --json output of kvgate kv. Sizes are for ONE GPU of the
// tensor-parallel group.
type kvReport struct {
	ModelConfig       string `json:"model_config"`
	ModelType         string `json:"model_type"`
	Family            string `json:"family"`
	Layers            int    `json:"layers"`
	KVHeads           int    `json:"kv_heads"`
	KVHeadsPerGPU     int    `json:"kv_heads_per_gpu"`
	HeadDim           int    `json:"head_dim"`
	MLA               bool   `json:"mla"`
	KVDType           string `json:"kv_dtype"`
	DTypeBytes        int    `json:"dtype_bytes"`
	TP                int    `json:"tp"`
	BlockSize         int    `json:"block_size"`
	BytesPerToken     int64  `json:"bytes_per_token"`
	BytesPerBlock     int64  `json:"bytes_per_block"`
	Params            int64  `json:"params"` // 0 when unknown
	WeightDType       string `json:"weight_dtype"`
	WeightBytes       int64  `json:"weight_bytes"`         // 0 when unknown
	WeightBytesPerGPU int64  `json:"weight_bytes_per_gpu"` // 0 when unknown
	// WeightsUnknown lists the config keys the weight estimate needs and the
	// config lacks (absent when the weights are known or given).
	WeightsUnknown []string `json:"weights_unknown_missing_keys,omitempty"`
	MaxPositions   int      `json:"max_position_embeddings,omitempty"`
}

// weightsKnown says whether the report has weight figures.
func (r *kvReport) weightsKnown() bool { return len(r.WeightsUnknown) == 0 }

// modelFlags are the flags kv and plan share: which model, served how.
type modelFlags struct {
	config    string
	tp        int
	kvDType   string
	blockSize int
	weights   sizeFlag
}

func (f *modelFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "model-config", "", "Hugging Face `config.json` of the model, or a directory holding one (required)")
	fs.IntVar(&f.tp, "tp", 1, "tensor-parallel size (GPUs sharing one model replica)")
	fs.StringVar(&f.kvDType, "kv-dtype", "auto", "KV-cache dtype: auto (the model's), float16, bfloat16, float32, fp8")
	fs.IntVar(&f.blockSize, "block-size", kvbudget.DefaultBlockSize, "KV block size in tokens (vLLM's --block-size)")
	fs.Var(&f.weights, "weights-bytes", "weight bytes of the whole model, overriding the estimate from the config (e.g. 16GB, 15GiB)")
}

// resolve loads the model and computes its layout and weights.
func (f *modelFlags) resolve() (kvReport, *kvbudget.Model, kvbudget.KVLayout, error) {
	if f.tp < 1 {
		return kvReport{}, nil, kvbudget.KVLayout{}, fmt.Errorf("--tp must be >= 1, got %d", f.tp)
	}
	if f.blockSize < 1 {
		return kvReport{}, nil, kvbudget.KVLayout{}, fmt.Errorf("--block-size must be >= 1, got %d", f.blockSize)
	}
	m, err := loadModel(f.config)
	if err != nil {
		return kvReport{}, nil, kvbudget.KVLayout{}, err
	}
	l, err := m.KVLayout(kvbudget.KVSpec{TP: f.tp, KVDType: f.kvDType, BlockSize: f.blockSize})
	if err != nil {
		return kvReport{}, nil, kvbudget.KVLayout{}, fmt.Errorf("--model-config %s: %w", f.config, err)
	}
	wd := m.ServedDType()
	weights := m.WeightBytes(wd)
	wdName := string(wd)
	if m.QuantBits > 0 {
		wdName = fmt.Sprintf("%s, linear layers at %d bits", wd, m.QuantBits)
	}
	params := m.EstimateParams().Total()
	var unknown []string
	if !m.WeightsKnown() {
		weights, params, unknown = 0, 0, m.WeightKeysMissing
	}
	if f.weights.set {
		weights, wdName, unknown = f.weights.size.Bytes, "as given by --weights-bytes", nil
	}
	r := kvReport{
		ModelConfig: f.config, ModelType: m.ModelType, Family: string(m.Family),
		Layers: l.Layers, KVHeads: l.KVHeads, KVHeadsPerGPU: l.KVHeadsPerGPU, HeadDim: l.HeadDim, MLA: l.MLA,
		KVDType: string(l.DType), DTypeBytes: l.DType.Bytes(), TP: l.TP, BlockSize: l.BlockSize,
		BytesPerToken: l.BytesPerToken, BytesPerBlock: l.BytesPerBlock,
		Params: params, WeightDType: wdName, WeightsUnknown: unknown,
		WeightBytes: weights, WeightBytesPerGPU: weights / int64(l.TP), MaxPositions: m.MaxPositions,
	}
	return r, m, l, nil
}

func runKV(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("kv", "--model-config PATH [--tp N] [--kv-dtype D] [--block-size 16] [--json]", stdout, stderr)
	var mf modelFlags
	mf.register(fs)
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	r, _, _, err := mf.resolve()
	if err != nil {
		return fail(stderr, "kv", exitUsage, "%v", err)
	}
	if *asJSON {
		return writeJSON(stdout, stderr, "kv", r)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "model\t%s (%s rules, model_type %q)\n", r.ModelConfig, r.Family, r.ModelType)
	fmt.Fprintf(tw, "layers\t%d\n", r.Layers)
	if r.MLA {
		fmt.Fprintf(tw, "kv cache\tone MLA latent of %d per layer, replicated on each of %d GPUs\n", r.HeadDim, r.TP)
	} else {
		fmt.Fprintf(tw, "kv heads\t%d in all, %d per GPU (tp %d)\n", r.KVHeads, r.KVHeadsPerGPU, r.TP)
		fmt.Fprintf(tw, "head dim\t%d\n", r.HeadDim)
	}
	fmt.Fprintf(tw, "kv dtype\t%s (%d bytes)\n", r.KVDType, r.DTypeBytes)
	fmt.Fprintf(tw, "block size\t%d tokens\n", r.BlockSize)
	fmt.Fprintf(tw, "per token\t%s (%d bytes) on each GPU\n", kvbudget.FormatBytes(r.BytesPerToken), r.BytesPerToken)
	fmt.Fprintf(tw, "per block\t%s (%d bytes)\n", kvbudget.FormatBytes(r.BytesPerBlock), r.BytesPerBlock)
	if r.Params > 0 {
		fmt.Fprintf(tw, "params\t%.2f B (estimated from the config)\n", float64(r.Params)/1e9)
	} else {
		fmt.Fprintf(tw, "params\tunknown\n")
	}
	if r.weightsKnown() {
		fmt.Fprintf(tw, "weights\t%s in %s, %s per GPU\n", kvbudget.FormatBytes(r.WeightBytes), r.WeightDType, kvbudget.FormatBytes(r.WeightBytesPerGPU))
	} else {
		fmt.Fprintf(tw, "weights\tunknown: the config lacks %s (pass --weights-bytes to give them)\n", strings.Join(r.WeightsUnknown, ", "))
	}
	if err := tw.Flush(); err != nil {
		return fail(stderr, "kv", exitNo, "write: %v", err)
	}
	return exitOK
}

func writeJSON(stdout, stderr io.Writer, cmd string, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fail(stderr, cmd, exitNo, "write: %v", err)
	}
	return exitOK
}
