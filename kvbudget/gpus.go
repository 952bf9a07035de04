package kvbudget

// GPU is a GPU model, the total memory the driver reports for it
// (nvidia-smi's "Total"), which is what vLLM sizes its cache against, and
// its peak memory bandwidth from the spec sheet. Spec sheets round the
// memory ("80 GB").
type GPU struct {
	Name   string
	Memory int64
	// Bandwidth is the peak memory bandwidth in bytes per second (SXM
	// parts where there are several), the bound of decoding (DecodeBound).
	Bandwidth float64
}

const mib = 1 << 20

// CommonGPUs are the cards capacity plans are usually made for, smallest
// first. A new slice is returned each call so callers may sort or trim it.
func CommonGPUs() []GPU {
	return []GPU{
		{"L4 24GB", 23034 * mib, 300e9},
		{"RTX 4090 24GB", 24564 * mib, 1008e9},
		{"A100 40GB", 40960 * mib, 1555e9},
		{"L40S 48GB", 46068 * mib, 864e9},
		{"A100 80GB", 81920 * mib, 2039e9},
		{"H100 80GB", 81559 * mib, 3350e9},
		{"H200 141GB", 143771 * mib, 4800e9},
	}
}

// DecodeBound is an upper bound on the output tokens per second one model
// replica generates with seqs sequences running, each holding kvPerSeq bytes
// of KV cache on every GPU: decoding is memory-bound, and each step reads
// every GPU's share of the weights and of every running sequence's KV once,
// so a step takes at least (weightsPerGPU + seqs × kvPerSeq) / bandwidth
// and yields seqs tokens. Real servers reach roughly 50–80% of it; it is for
// ranking GPUs against each other, not a promise. 0 when nothing runs.
func DecodeBound(bandwidth float64, weightsPerGPU, kvPerSeq, seqs int64) float64 {
	if seqs <= 0 || bandwidth <= 0 {
		return 0
	}
	step := float64(weightsPerGPU+seqs*kvPerSeq) / bandwidth
	if step <= 0 {
		return 0
	}
	return float64(seqs) / step
}
