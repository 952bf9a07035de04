// Package backends knows the upstream servers: which models each serves, on
// which GPU it sits, whether it is healthy, what its own metrics say of its
// KV cache, and how to forward a request to it and stream the answer back.
//
// Subpackages: gpuinfo reads local GPUs through NVML; sim is a vLLM-style
// simulated backend for tests, demos and load tests.
package backends
