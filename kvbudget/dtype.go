package kvbudget

import (
	"fmt"
	"strings"
)

// DType is the element type of a tensor as kvbudget cares about it: only its
// width matters, but the name is kept for reports.
type DType string

// The element types vLLM can hold weights or a KV cache in.
const (
	Float32  DType = "float32"
	Float16  DType = "float16"
	BFloat16 DType = "bfloat16"
	FP8      DType = "fp8"
)

// Bytes is the width of one element.
func (d DType) Bytes() int {
	switch d {
	case Float32:
		return 4
	case Float16, BFloat16:
		return 2
	case FP8:
		return 1
	}
	return 0
}

// ParseDType reads a dtype as Hugging Face configs and vLLM flags spell it
// ("torch.float16", "half", "bf16", "fp8_e4m3", ...). "auto" is not a dtype; see
// ResolveKVDType.
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(strings.TrimPrefix(strings.TrimSpace(s), "torch.")) {
	case "float32", "fp32", "float":
		return Float32, nil
	case "float16", "fp16", "half":
		return Float16, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	case "fp8", "fp8_e4m3", "fp8_e5m2", "float8_e4m3fn", "float8_e5m2", "fp8_inc", "fp8_ds_mla":
		return FP8, nil
	}
	return "", fmt.Errorf("unknown dtype %q (want auto, float16, bfloat16, float32 or fp8)", s)
}

// ResolveKVDType picks the KV-cache dtype for a model whose weights are in
// modelDType, given the user's choice (the value of vLLM's --kv-cache-dtype,
// or "" for auto). vLLM's "auto" follows the model dtype, except that a
// float32 checkpoint is served in float16.
func ResolveKVDType(choice string, modelDType DType) (DType, error) {
	if c := strings.ToLower(strings.TrimSpace(choice)); c == "" || c == "auto" {
		if modelDType == Float32 || modelDType == "" {
			return Float16, nil
		}
		return modelDType, nil
	}
	return ParseDType(choice)
}
