// Package kvevents follows what a vLLM GPU holds in its prefix cache, from
// the KV events vLLM publishes (--kv-events-config): over ZeroMQ PUB/SUB,
// each message the frames [topic, 8-byte big-endian sequence number,
// msgpack KVEventBatch], the batch's events BlockStored (block hashes, the
// parent's hash, the blocks' token ids, block size, LoRA id, medium),
// BlockRemoved (hashes, medium) and AllBlocksCleared, in vLLM's positional
// encoding (msgspec array_like, each event an array led by its tag) or the
// map encoding (the tag under "type"). A publisher may also answer replay
// requests on a ROUTER socket: an 8-byte sequence number in, each batch it
// still has from there out, then an end marker.
//
// Model. An Index names every block by the gateway's own chained hash of
// its token ids (Chain), not by vLLM's block hashes, which change between
// vLLM versions and hash settings; vLLM's hashes serve only to match a
// removal or a parent to what was stored. So a prompt's chain, made by the
// gateway from /tokenize, is looked up directly: Cached says how many of
// its leading blocks the GPU holds.
//
// Trust. The index is exact while no message is lost: it holds what the
// publisher stored and did not remove. A Subscriber checks the sequence
// numbers: a gap is filled from the replay socket if there is one; else,
// and on a garbage message or a publisher gone, the index is reset and is
// not whole until the publisher clears its cache, restarts (a new process
// starts from sequence 0 with an empty cache), or has stored as many
// blocks as its cache holds. A reset index claims only blocks stored since,
// a subset of the truth; callers still fall back to their estimate while it
// is not whole. Every fault is counted (Stats) for metrics and /status.
//
// What it does not do: it tracks the GPU tier only (CPU-offloaded blocks
// are not on the GPU), names a LoRA adapter's blocks apart from the base
// model's (never matched), and cannot see a request's cache_salt, which
// vLLM's events do not carry: salted prompts are named as the gateway salts
// them, so they never match what the index holds.
package kvevents
