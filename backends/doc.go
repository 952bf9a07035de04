// Package backends knows the upstream servers: which models each serves,
// whether it is healthy, what its own metrics say about its KV cache, how to
// pick one for a request, and how to forward a request to it and stream the
// answer back.
//
// Model. A Backend is one OpenAI-compatible server (vLLM, or kvgate sim)
// reached through an Upstream, a keep-alive transport that owns each
// connection so that cancelling a request closes it and the backend aborts.
// Each Backend has a circuit (closed → open after FailThreshold consecutive
// failed health probes or failures to connect → closed again by the first
// passing probe; or open after as many consecutive first-byte timeouts the
// gateway reports → half-open to traffic after Cooldown → closed by an
// answered request, not by a probe) and the latest KVReport scraped from
// its /metrics with vLLM's metric names. A request's own failure — a 4xx,
// a body the backend refused, a reset while sending it — never counts: one
// client must not take a backend away from everyone. A Pool routes a model's requests to the
// available backend with the most free admission budget, ties broken
// round-robin.
//
// This package does not decide admission: it reads a budget's free bytes
// through the small Budget interface and reports KV usage through a callback;
// the gateway owns the budgets. Background probing runs only under Pool.Run,
// so tests drive probes and circuits by hand with an injected clock.
//
// Subpackages: connwatch notices client hang-ups; gpuinfo reads GPUs'
// memory and the processes holding it, through NVML or from a GPU node's
// exporter; kvevents follows vLLM's KV events into an index of what a GPU
// holds cached; sim is a vLLM-style simulated backend.
package backends
