// Package gpuinfo reads the memory of GPUs: through NVML
// (github.com/NVIDIA/go-nvml) on this host, the second most trusted source
// of a KV budget after the backend's own report, or from a GPU node over
// HTTP (NVIDIA's DCGM exporter, or `kvgate gpus --listen`).
//
// Per device it gives total, used and free memory and, where the source can
// (NVML, kvgate gpus), the processes holding memory: pid, name, bytes, and
// the TCP ports each listens on or descends from a listener of, which is how
// the gateway tells a backend's own process from the others.
//
// NVML is loaded at run time: on a machine with no NVIDIA driver (CI, a
// laptop, a CPU node) Probe and OpenNVML return an error matching ErrNoGPU
// and nothing else changes, so callers fall back to the configured sizes.
// Probe holds no state between calls; an NVML from OpenNVML keeps the
// library initialised until Close. The package decides nothing: what the
// figures mean for a budget is the gateway's part.
package gpuinfo
