package kvbudget

// GPU is a GPU model and the total memory the driver reports for it
// (nvidia-smi's "Total"), which is what vLLM sizes its cache against. Spec
// sheets round these ("80 GB").
type GPU struct {
	Name   string
	Memory int64
}

const mib = 1 << 20

// CommonGPUs are the cards capacity plans are usually made for, smallest
// first. A new slice is returned each call so callers may sort or trim it.
func CommonGPUs() []GPU {
	return []GPU{
		{"RTX 4090 24GB", 24564 * mib},
		{"A100 40GB", 40960 * mib},
		{"L40S 48GB", 46068 * mib},
		{"A100 80GB", 81920 * mib},
		{"H100 80GB", 81559 * mib},
		{"H200 141GB", 143771 * mib},
	}
}
