// Package gateway is kvgate's OpenAI-compatible reverse proxy: it admits a
// request only when the KV cache the request will need fits in the budget
// of the GPU that will serve it.
//
// One request, end to end: the handler reads only the fields that decide
// admission (model, messages or prompt, max_tokens / max_completion_tokens,
// n / best_of, stream, stream_options), exactly as vLLM will read them — a
// body parsers could read two ways (a repeated field, a length field the
// endpoint does not have, a number past int64) is refused or rewritten to
// the backend's reading — and forwards the body otherwise byte for byte.
// It counts the prompt's tokens (a backend's /tokenize, remembered per
// prompt in a bounded cache, or an estimate calibrated against the usage
// backends report), and describes the request
// to the admission scheduler as a shape: per prompt its tokens, the output
// it may generate (max_tokens, else the model's default, else the rest of
// the context) and its sequences, in the model's KV blocks (package
// kvbudget). It waits in its model's queue (package admission: priority
// classes, tenants, bounded queue, early shedding with Retry-After) until
// one of the model's GPUs has room for it — under the predicted policy,
// room for the forecast of its growth beside the others' — and is bound
// there; it is forwarded to a backend of that GPU and the answer relayed,
// SSE event by event, flushed as it arrives, the 200 promised only once the
// first event is here (a backend that sends none within first_byte_timeout
// gives a 504), while the relay reports each choice's progress and end to
// its ticket. A stream is a success once [DONE] reached the client; one
// that ends otherwise gets a final error event and is a failure.
//
// Invariants. Every request leaves through exactly one finish, which
// releases its reservation, stops watching its client, cancels its
// upstream exchange and writes its access-log line; a client hang-up (noticed through package connwatch
// even while the request is queued or waiting for a non-streamed answer), a
// request timeout and a shutdown all end the request's context, and an
// ended context closes the upstream connection, which is how the backend
// learns to abort. A choice that finishes early gives its blocks back at
// once. A request reads the configuration once (an immutable runtime) and a
// reload swaps in a new one, keeping the budgets and backends that persist,
// so reservations in flight survive it.
//
// A request whose backend fails before the first byte is retried on another
// backend of its GPU, and once on another GPU (its ticket moved, never held
// twice). After every probe the gateway tells the scheduler which GPUs may
// take each model's requests.
//
// On SIGTERM (Drain) readiness turns first and the listener serves on for
// server.drain_delay, so that load balancers stop sending before it closes;
// then the requests in flight get server.shutdown_timeout to finish.
//
// What it does not do: retry after the first byte reached the client, or
// enforce separate pools for several vLLM processes that share one GPU
// budget.
package gateway
