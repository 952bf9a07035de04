// Package gpuinfo reads the memory of the local GPUs through NVML
// (github.com/NVIDIA/go-nvml), the second most trusted source of a KV budget
// after the backend's own report.
//
// NVML is loaded at run time: on a machine with no NVIDIA driver (CI, a
// laptop, a CPU node) Probe returns an error matching ErrNoGPU and nothing
// else changes, so callers fall back to the configured sizes. The package
// holds no state between calls; each Probe initialises and shuts NVML down.
package gpuinfo
