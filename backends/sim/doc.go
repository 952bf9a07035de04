// Package sim is a simulated vLLM server: the backend behind `kvgate sim`,
// the gateway's demo, and every end-to-end test and load test, since no GPU
// is at hand. It is faithful to vLLM where memory is concerned, speaks vLLM's
// OpenAI-compatible HTTP API, and is deterministic under a seed.
//
// # Memory
//
// A simulated GPU of Config.GPUMemory bytes gives the KV cache
// memory × GPUMemoryUtilization − weights − reserve (weights estimated from
// the model geometry by kvbudget unless given), cut into blocks of BlockSize
// tokens: kvbudget.KVLayout's bytes per block, so the pool is exactly what
// the gateway computes for the same card. With the defaults (Llama-3-8B in
// bf16, 24 GiB, 0.9, 1 GiB reserve) that is 2888 blocks, 46208 tokens. As
// vLLM does, the server refuses to start when one sequence of MaxModelLen
// tokens would not fit.
//
// A sequence that has generated g tokens holds ceil((prompt+g)/BlockSize)
// blocks; it takes a new block in the step whose token crosses a block
// boundary, and gives its blocks back the moment it finishes. The n
// sequences of one request share the prompt's full blocks (vLLM's prefix
// sharing for parallel sampling), each keeping its own partial block and what
// it generates, so a request's peak, before any sharing with other
// requests, is exactly kvbudget's RequestBlocks.
// (vLLM writes the KV of a sampled token one step later, so a real server
// holds one token less than this; the simulator is at most one block
// pessimistic at a boundary, and agrees with the gateway's prediction.)
//
// Memory that is shared is counted once: the simulator models vLLM V1's
// automatic prefix caching (prefixcache.go, kvblocks.go), on unless
// Config.DisablePrefixCaching (--enable-prefix-caching=false). A full block's
// identity is a hash chained over its parent block's hash and its token ids,
// from a root that the request's cache_salt changes, so tenants with
// different salts never share. Only full blocks are hashed: a prompt's when
// the request is admitted (so that a request admitted after it, in the same
// step too, finds them), and each sequence's blocks as its output fills them.
// A request admitted looks up its leading blocks and reuses the run it finds,
// held by running requests or cached; as in vLLM it never finds its last
// token, which is computed for its logits, so a prompt of exactly N full
// blocks reuses at most N−1. The tokens found are not prefilled again.
//
// Each running request that holds a cached block adds one to its reference
// count (a request's n sequences hold its prompt blocks once, as before); at
// zero the block is free, and its KV stays findable until an allocation
// needs it. Allocations take free blocks that hold nothing first (recent
// vLLM puts those at the front of its free queue; older V1 releases queued
// every freed block at the back), then evict cached ones least recently
// freed first; a request frees its blocks last first, so the end of its
// output goes before its prompt's start. So the pool is referenced blocks
// plus free ones, cached or not: vllm:kv_cache_usage_perc,
// kvsim_kv_cache_used_blocks and the admission watermark count referenced
// blocks only, and out of memory, in either OnOverflow mode, still means
// that new blocks cannot be had. A preempted request drops its references;
// its blocks stay cached, and when it is admitted again its recomputation
// reuses what was not evicted meanwhile. vllm:prefix_cache_queries_total and
// vllm:prefix_cache_hits_total count, in tokens, the prompts of admitted
// requests and the part of them found, once per request (vLLM counts each
// look-up, including those of a request that then waits, and counts the
// recomputation of a preempted request apart).
// Config.HidePrefixCachingLabel (--hide-prefix-caching-label) leaves
// enable_prefix_caching out of vllm:cache_config_info while the counters go
// on: a server that shares prefixes and says so only through its hits.
//
// Generated blocks are hashed by the token ids the simulator's tokenizer
// gives their text, and that text is pieces of one token each that do not
// merge (see Tokens): so a conversation's next turn, which sends the
// history back as its prompt (the assistant message's content verbatim, or
// a completion prompt followed by the text generated for it), has the
// history's tokens exactly and finds its blocks, up to the last full one
// (for a completion, as long as the text added after the output does not
// join its last token, as " the" and "ory" would).
//
// Where the simulator differs from vLLM: a block whose hash is already
// cached is kept as an anonymous duplicate, not a second copy vLLM could
// also find; hashes are 64-bit mixes, not vLLM's SHA-256; requests asking
// for prompt logprobs, which vLLM keeps out of the cache, are cached like
// others (the simulator ignores logprobs); and n > 1 sequences share their
// prompt's full blocks with the cache off too (vLLM V1 shares them through
// the cache).
//
// # Scheduling
//
// One engine goroutine runs vLLM's continuous batching (engine.go). Each step
// first gives every running request, oldest first, the blocks its next token
// needs; when none are left, the newest running request is preempted: its
// blocks are freed and it goes back to the front of the waiting queue, to be
// recomputed (its prompt and what it had generated are prefilled again, the
// tokens already sent are not sent twice) when it is admitted again;
// vllm:num_preemptions_total counts each. Then, unless the step preempted,
// waiting requests are admitted in FIFO order while the one at the head fits:
// at most MaxNumSeqs sequences running, and its blocks must leave 1% of the
// pool free (vLLM's watermark, which keeps room for the running ones to
// grow). Every running sequence then gains one token.
//
// # Timing
//
// A step lasts StepBase + StepPerSeq × running sequences + PrefillPerToken ×
// tokens prefilled in it, in simulated time, and TimeScale turns that into
// wall time (0.01: 100× faster; 0: the engine is free). The defaults model
// Llama-3-8B on a 24 GiB card of the RTX 4090 / L4 / A10 class: a decode step
// reads all 16 GB of weights once, about 15 ms at 1 TB/s; each sequence adds
// its attention over the KV cache and its share of the matmuls, 150 µs; and
// prefill is compute-bound at 2 × 8 GFLOP a token, 100 µs a token at
// 160 TFLOP/s (the peak of the fastest such card, so prefill is on the quick
// side). So a lone request streams a token every
// ~15 ms, a batch of 64 every ~25 ms (2600 tokens/s), one of 256 every
// ~53 ms (4800 tokens/s), and a 200-token prompt sees its first token after
// ~35 ms. Sleeps are paced against a deadline, so a small TimeScale keeps its
// average rate although each sleep overshoots. Latency histograms are wall
// time, as vLLM's are.
//
// # Overflow
//
// OnOverflow "preempt" is vLLM's behaviour above. "oom" is a server with no
// headroom (or a GPU shared with other work): it admits whatever it is sent,
// with no waiting queue and no max_num_seqs, and the moment a block is needed
// that the pool does not have, every request in flight fails with an error
// whose message contains "CUDA out of memory" (HTTP 500, or, for a stream
// that has begun, an SSE error event and [DONE]), kvsim_oom_events_total
// counts it, and the server is unhealthy (/health 503, new requests 503) for
// OOMRestart of simulated time.
//
// # Determinism
//
// Output text and output lengths are functions of Config.Seed and the
// request's content (prompt or messages, max_tokens, n, its seed field), never
// of arrival order or of what else runs: each sequence's key is a hash of
// those, its length is drawn from OutputLen with that key (or from the
// distribution of the first OutputLenWhen rule whose text the body contains:
// a workload's lengths can change with what is asked, as a real model's do,
// without a field a gateway could read; max_tokens when the distribution is
// empty or ignore_eos is set, at least min_tokens), and its
// i-th token is a fixed list's entry picked by hashing the key and i. The
// same request streamed or not gives the same text. Timing is not
// deterministic: it is wall-clock sleeps on a shared machine. Tests that need
// exact schedules step the engine by hand.
//
// # Tokens
//
// The tokenizer is the simulator's own (tokenizer.go), about four bytes a
// token on English, with Llama-3's chat template; the gateway must not share
// it. /tokenize exposes it. Each generated token is one token of it, so
// completion_tokens is what /tokenize says of the output, and its ids are
// those /tokenize gives the output text: each piece is a space and at most
// three letters, or one punctuation mark, and none joins the token before
// or after it. Its ids are hashes of the pieces, so /detokenize reads them
// back through a vocabulary learnt from /tokenize's answers (vocab.go): it
// decodes the ids /tokenize has given and those of generated text, and
// refuses others, naming the id.
//
// # Stream events
//
// Each SSE event of a stream carries one token, as a vLLM that keeps up
// sends it, unless Config.StreamInterval (vLLM's --stream-interval) or
// Config.StreamMerge (random merges, as a vLLM whose API server lags its
// engine) say otherwise (streamevents.go); the Responses and Messages
// streams merge their deltas alike.
//
// # HTTP
//
// POST /v1/chat/completions and /v1/completions (streamed or not; n;
// max_tokens, max_completion_tokens, min_tokens, ignore_eos, cache_salt;
// stream_options.include_usage and continuous_usage_stats, the latter the
// choice's cumulative usage on every chunk as vLLM puts it, unless
// Config.NoContinuousUsage), GET /v1/models (with max_model_len),
// POST /tokenize, POST /detokenize, POST /v1/messages/count_tokens
// (Anthropic's, answered {"input_tokens": n} as vLLM does, the messages
// read as /v1/messages reads them), GET /health and GET /metrics (vLLM's metric names and
// labels, plus kvsim_ ones). The pooling routes, POST /v1/embeddings,
// /pooling, /classify, /score and /v1/score, /rerank, /v1/rerank and
// /v2/rerank, answer in vLLM's shapes with usage (pooling.go): each input,
// or each pair a score or a rerank compares, is a request of its own whose
// one step is its prefill, holding its prompt's blocks and no decode slot;
// the vectors and scores are drawn from its tokens. Errors have vLLM's body
// {"error":{"message","type","param","code"}}: 400 BadRequestError for bad
// JSON, types and values, and vLLM's context-length messages; 404
// NotFoundError for an unknown model, and for a missing one (recent vLLM
// serves its default model then; the simulator refuses, so that a client that
// drops the field is caught). A rejected request allocates nothing.
//
// A client that disconnects has its request aborted and its blocks freed at
// once, as vLLM aborts it: when internal/connwatch sees the connection
// hang up (Linux TCP; not in-memory listeners) — a request still queued,
// waiting for its answer or its first token, or streaming — or else at a
// stream's first failed write.
//
// # Not modelled
//
// Sampling and stop strings (stop, temperature, logprobs and the like are
// accepted and ignored); offloading cached KV to CPU; chunked prefill
// (a prompt is prefilled in one step); swapping to CPU; tensor parallelism;
// CUDA graphs and activation memory beyond the fixed reserve; the
// tokenizer-dependent details of real models; batched prompts in one
// completions request; tool calls, images and other non-text content; and
// fairness between tenants, which is the gateway's job.
package sim
