// Package loadtest finds the safe concurrency (or request rate) of an
// OpenAI-compatible deployment: it fixes everything but the load, raises the
// load step by step, watches throughput, latency and the KV-memory curve
// together, and states the highest level that was safe and where it first
// broke. It speaks only HTTP, so the target may be vLLM, kvgate's simulator
// or kvgate itself in front of either.
//
// # Measurement model
//
// A step is one load level. In a closed loop (concurrency N) N workers each
// send their next request when the last one ends; in an open loop (rate R)
// requests arrive as a Poisson process of rate R and are sent whether or not
// earlier ones are done. Each attempt at a step first sends warm-up requests
// (one per worker, or about a second of arrivals) that are not counted, then
// counts requests until Requests are done or Duration has passed; requests
// still in flight then finish and are counted. Every request has a timeout
// and every attempt a maximum time, so a run always ends by itself.
//
// Per request, the clock starts just before the request is written. TTFT is
// the arrival of the first SSE chunk that carries generated text (role-only
// and usage-only chunks do not count), each later content chunk adds one
// inter-token gap (ITL), the end is [DONE]; output tokens come from the
// final usage chunk (stream_options.include_usage), else one a chunk. This
// is how vLLM's benchmark_serving measures, so the figures compare. Per
// step, throughput is completed requests (and their output tokens) over the
// measured window — first counted request sent to last one finished —,
// counting the warm-up requests that finish inside it too (the server's
// work in that window; a closed loop's warm-up often drains there), and
// latencies are reported as p50, p90 and p99 by linear interpolation between
// closest ranks (NumPy's default). Each request ends in exactly one outcome:
// ok, shed (429), 4xx, 5xx, overflow (an out-of-memory error in the body or
// the stream, whatever the status but 503, which refuses rather than
// overflows), connection error, timeout, or incomplete (cut with its step;
// left out of every figure). Warm-up requests are in no figure, but their
// failures count against the step.
//
// While a step runs, the target's /metrics (or --metrics-url) is scraped
// every 250 ms (--scrape-interval; the memory curve says its interval) for
// vLLM's KV usage (vllm:kv_cache_usage_perc, else
// vllm:gpu_cache_usage_perc), running and waiting requests and preemptions;
// the step's peak KV usage is the highest scrape, or the simulator's exact
// kvsim_kv_usage_peak_ratio when that rose during the step.
//
// Prompts are random common words, built to the requested token length with
// a per-word token cost measured once on the target's /tokenize (the chat
// template's overhead included) and checked on sample prompts; without
// /tokenize, one token a word is assumed and the report says so. Lengths
// depend only on the seed and the request number, so every step of every
// target sees the same lengths; the words differ, so nothing is served from
// a prefix cache. Two options share prompts on purpose, as applications do:
// --shared-prefix opens every request of a step with one system prompt (a
// new one each step), and --turns makes each closed-loop worker hold
// multi-turn sessions whose every turn re-sends the session so far — the
// earlier user messages and the answers the server actually gave — before
// a new user message. What follows the shared part stays distinct.
//
// # What "safe" means
//
// A step is safe when, over its counted requests: none overflowed, failed
// with a 5xx or another 4xx, timed out or lost its connection; the peak KV
// usage stayed at or under --max-kv-usage (default 0.75; note this is vLLM's
// share of its KV block pool, not of GPU memory); it was not over-saturated;
// and, when SLOs are given, the share of requests that met every SLO is at
// or above --slo-attainment (default 0.99, i.e. p99 within the SLO) with
// confidence: the lower Wilson bound must clear the target. Requests shed
// with 429 are not failures (a gateway in front is meant to shed) and are
// not in the attainment's denominator. A step with too few requests, or
// whose attainment interval straddles the target, is inconclusive: it is run
// again, the attempts pooled, and if still unsure it counts as not safe. The
// safe level is the highest one that passed with every lower level also
// passing. A step whose time to first token rises steadily while throughput
// stays flat (the queue running away) is stopped early and is not safe.
//
// # What it does not do
//
// It does not manage the target, restart it after a crash (it waits, up to
// the cooldown, for /health and an idle engine between steps), or judge
// output quality. Levels above the first failure are not run unless asked,
// since they can only be worse.
package loadtest
