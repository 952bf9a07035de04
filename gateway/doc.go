// Package gateway is kvgate's OpenAI-compatible reverse proxy: it admits a
// request only when the KV cache the request will need fits in the budget
// of the GPU that will serve it.
//
// One request, end to end: the handler reads only the fields that decide
// admission (model, messages or prompt, max_tokens / max_completion_tokens,
// n / best_of, stream, stream_options) and forwards the body otherwise
// byte for byte. It counts the prompt's tokens (the backend's /tokenize,
// remembered per prompt in a bounded cache, or an estimate calibrated
// against the usage backends report), adds the
// output it may generate (max_tokens, else the model's default, else the
// rest of the context), and reserves ceil(tokens / block size) blocks per
// sequence, prompt blocks shared across n, in bytes of one GPU
// (package kvbudget). It picks the healthy backend with the most free
// budget, waits for admission there (package admission: priority classes,
// tenants, bounded queue, early shedding with Retry-After), forwards, and
// relays the answer — SSE event by event, flushed as it arrives.
//
// Invariants. Every request leaves through exactly one finish, which
// releases its reservation, stops watching its client and cancels its
// upstream exchange; a client hang-up (noticed through package connwatch
// even while the request is queued or waiting for a non-streamed answer), a
// request timeout and a shutdown all end the request's context, and an
// ended context closes the upstream connection, which is how the backend
// learns to abort. A choice that finishes early gives its blocks back at
// once. A request reads the configuration once (an immutable runtime) and a
// reload swaps in a new one, keeping the budgets and backends that persist,
// so reservations in flight survive it.
//
// What it does not do: retry after the first byte reached the client,
// share budgets across gateway replicas (each replica must be given its own
// share of a GPU today), or enforce separate pools for several vLLM
// processes that share one GPU budget.
package gateway
