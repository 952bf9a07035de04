package kvbudget

import (
	"errors"
	"fmt"
	"math"
)

// DefaultBlockSize is vLLM's default KV block size in tokens.
const DefaultBlockSize = 16

// KVSpec is how a model is served: the choices that change its KV cache.
type KVSpec struct {
	TP        int    // tensor-parallel size; 0 means 1
	KVDType   string // vLLM's --kv-cache-dtype; "" or "auto" follows the model
	BlockSize int    // tokens per KV block; 0 means DefaultBlockSize
}

// KVLayout is the KV cache of one model on ONE GPU of its tensor-parallel
// group: every GPU of the group holds the same tokens, each its share of heads.
type KVLayout struct {
	Layers        int
	KVHeads       int // across the whole group
	KVHeadsPerGPU int // max(1, KVHeads/TP): heads are replicated, never split
	HeadDim       int
	DType         DType
	TP            int
	BlockSize     int
	MLA           bool // one latent per layer, no separate K and V

	BytesPerToken int64
	BytesPerBlock int64
}

// KVLayout computes the per-GPU cache layout of m served as spec. It refuses
// the tensor-parallel sizes vLLM refuses: the query heads must split evenly,
// and the KV heads must either split evenly or be replicated evenly.
func (m *Model) KVLayout(spec KVSpec) (KVLayout, error) {
	tp, bs := spec.TP, spec.BlockSize
	if tp == 0 {
		tp = 1
	}
	if bs == 0 {
		bs = DefaultBlockSize
	}
	if tp < 0 {
		return KVLayout{}, fmt.Errorf("tensor parallel size must be >= 1, got %d", tp)
	}
	if bs < 0 {
		return KVLayout{}, fmt.Errorf("block size must be >= 1, got %d", bs)
	}
	dt, err := ResolveKVDType(spec.KVDType, m.DType)
	if err != nil {
		return KVLayout{}, fmt.Errorf("kv dtype: %w", err)
	}
	if m.Heads%tp != 0 {
		return KVLayout{}, fmt.Errorf("%d attention heads are not divisible by tensor parallel size %d", m.Heads, tp)
	}
	l := KVLayout{
		Layers: m.Layers, KVHeads: m.KVHeads, HeadDim: m.HeadDim,
		DType: dt, TP: tp, BlockSize: bs, MLA: m.MLA != nil,
	}
	switch {
	case l.MLA:
		// The latent is replicated on every GPU of the group.
		l.KVHeadsPerGPU = 1
	case m.KVHeads >= tp:
		if m.KVHeads%tp != 0 {
			return KVLayout{}, fmt.Errorf("%d KV heads are not divisible by tensor parallel size %d", m.KVHeads, tp)
		}
		l.KVHeadsPerGPU = m.KVHeads / tp
	default:
		if tp%m.KVHeads != 0 {
			return KVLayout{}, fmt.Errorf("tensor parallel size %d is not a multiple of %d KV heads, so they cannot be replicated evenly", tp, m.KVHeads)
		}
		l.KVHeadsPerGPU = 1
	}
	perLayer := int64(l.KVHeadsPerGPU) * int64(l.HeadDim) * int64(dt.Bytes())
	if !l.MLA {
		perLayer *= 2 // K and V
	}
	l.BytesPerToken = int64(l.Layers) * perLayer
	l.BytesPerBlock = l.BytesPerToken * int64(bs)
	return l, nil
}

// Blocks is the number of blocks that tokens tokens occupy in one sequence.
func Blocks(tokens, blockSize int) int64 {
	if tokens <= 0 {
		return 0
	}
	b := int64(tokens / blockSize) // not (tokens+blockSize-1)/blockSize, which wraps near MaxInt
	if tokens%blockSize != 0 {
		b++
	}
	return b
}

// GroupBlocks is the one formula for the KV blocks a request's prompt and
// its sequences take: n sequences of prompt + output tokens each hold the
// prompt's full blocks once between them (vLLM shares them between the
// sequences of a request), and each its own partial prompt block and its
// generated blocks. heldShared of the prompt's full blocks are already held
// on the GPU by another request (vLLM's prefix cache holds a block once):
// they are not counted again. Admission, the error messages and the
// simulator all size a request with it. It saturates at math.MaxInt64: a
// request too large to count is larger than any budget, never wrapped into a
// small one.
func GroupBlocks(prompt, output, n, blockSize int, heldShared int64) int64 {
	if n < 1 {
		n = 1
	}
	prompt, output = max(prompt, 0), max(output, 0)
	shared := int64(prompt / blockSize)
	own := Blocks(satAddInt(prompt, output), blockSize) - shared
	return satAdd(max(shared-max(heldShared, 0), 0), satMul(int64(n), own))
}

// GroupBytes is GroupBlocks in bytes of one GPU, saturating too.
func (l KVLayout) GroupBytes(prompt, output, n int, heldShared int64) int64 {
	return satMul(GroupBlocks(prompt, output, n, l.BlockSize, heldShared), l.BytesPerBlock)
}

// SumBytes adds sizes in bytes, saturating: a request's groups, for one
// size to compare with a budget.
func SumBytes(sizes ...int64) int64 {
	var t int64
	for _, s := range sizes {
		t = satAdd(t, s)
	}
	return t
}

// RequestBlocks is the blocks a request of one prompt takes at its largest,
// sharing nothing with other requests (GroupBlocks).
func (l KVLayout) RequestBlocks(prompt, output, n int) int64 {
	return GroupBlocks(prompt, output, n, l.BlockSize, 0)
}

// RequestBytes is RequestBlocks in bytes of one GPU.
func (l KVLayout) RequestBytes(prompt, output, n int) int64 {
	return l.GroupBytes(prompt, output, n, 0)
}

// satAdd, satAddInt and satMul add and multiply sizes (non-negative),
// stopping at the largest value instead of wrapping.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satAddInt(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// ErrWeightsDoNotFit is returned (wrapped) when a GPU has no room left for any
// KV cache once the weights and the reserve are placed.
var ErrWeightsDoNotFit = errors.New("weights do not fit")

// GPUBudget is one GPU's memory as the gateway sees it.
type GPUBudget struct {
	Memory    int64   // total memory of the GPU
	Ceiling   float64 // fraction of Memory that the server may use, weights included
	Weights   int64   // weight bytes held by THIS GPU (the model's share under TP)
	Reserve   int64   // activations, CUDA graphs, allocator slack
	OtherUsed int64   // memory held by other processes on the same GPU
}

// DefaultReserve is the activation and runtime memory kept aside per GPU when
// ops give none: vLLM's profiled activation peak at its default batch size,
// plus CUDA graphs and non-torch allocations, for a 7-13B model.
const DefaultReserve int64 = 1 << 30

// DefaultCeiling is the fraction of GPU memory the gateway lets the KV cache
// fill up to, weights included, leaving headroom for fragmentation and spikes.
const DefaultCeiling = 0.75

// KVBytes is what is left for the KV cache:
// Memory × Ceiling − Weights − Reserve − OtherUsed. It fails with
// ErrWeightsDoNotFit when nothing is left.
func (g GPUBudget) KVBytes() (int64, error) {
	if g.Memory <= 0 {
		return 0, fmt.Errorf("gpu memory must be > 0, got %d", g.Memory)
	}
	if g.Ceiling <= 0 || g.Ceiling > 1 {
		return 0, fmt.Errorf("ceiling must be in (0, 1], got %g", g.Ceiling)
	}
	if g.Weights < 0 || g.Reserve < 0 || g.OtherUsed < 0 {
		return 0, errors.New("weights, reserve and other used memory must be >= 0")
	}
	usable := int64(float64(g.Memory) * g.Ceiling)
	kv := usable - g.Weights - g.Reserve - g.OtherUsed
	if kv <= 0 {
		return kv, fmt.Errorf("%w: %s usable (%s × %.2f) minus %s of weights, %s reserve and %s used by others leaves %s",
			ErrWeightsDoNotFit, FormatBytes(usable), FormatBytes(g.Memory), g.Ceiling,
			FormatBytes(g.Weights), FormatBytes(g.Reserve), FormatBytes(g.OtherUsed), FormatBytes(kv))
	}
	return kv, nil
}

// Capacity is what a KV budget holds for one layout.
type Capacity struct {
	Bytes  int64 // the budget
	Blocks int64 // whole blocks in it
	Tokens int64 // Blocks × BlockSize
}

// CapacityOf splits a KV byte budget into whole blocks of l.
func (l KVLayout) CapacityOf(kvBytes int64) Capacity {
	if kvBytes <= 0 || l.BytesPerBlock <= 0 {
		return Capacity{Bytes: max(kvBytes, 0)}
	}
	b := kvBytes / l.BytesPerBlock
	return Capacity{Bytes: kvBytes, Blocks: b, Tokens: b * int64(l.BlockSize)}
}

// MaxConcurrency is how many sequences of context tokens fit in c at once.
func (l KVLayout) MaxConcurrency(c Capacity, context int) int64 {
	per := Blocks(context, l.BlockSize)
	if per == 0 {
		return 0
	}
	return c.Blocks / per
}
