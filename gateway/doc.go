// Package gateway is kvgate's OpenAI-compatible reverse proxy: it admits a
// request only when the KV cache the request will need fits in the budget
// of the GPU that will serve it. What to admit, when and where is package
// admission's; the gateway turns HTTP into the shapes admission weighs, and
// admission's answers back into HTTP.
//
// # A request, end to end
//
// A request is routed by its path through the table of routes
// (routes.go: routeTable), where each route is declared once — its
// method, its path, how the 404 lists it, and what serves it. A route
// that admits names its API's entry of apis: how its body is read, its
// prompts found, its reservation made and how it runs once admitted
// (completion.go for chat and completions, generation.go, pooling.go).
// The routes that reserve nothing, /tokenize and those passed through,
// take the admitted routes' first and last steps only (unadmitted.go).
//
// Every admitted request then runs the loop (loop.go): arrival → count →
// admit → forward → answer. serveAdmitted authenticates the client
// (arrival.go) and reads only the fields that decide admission (parse.go:
// model, messages or prompt, max_tokens / max_completion_tokens, n /
// best_of, stream, stream_options), exactly as vLLM will read them — a body
// parsers could read two ways (a repeated field, a length field the
// endpoint does not have, a number past int64, what JSON forbids in a
// string; the grammar's checks are package jsonscan's) is refused or
// rewritten to the backend's reading (forward.go) — and forwards the body
// otherwise byte for byte.
//
// It counts the prompt's tokens (reservation.go: a backend's /tokenize,
// remembered per prompt in a bounded cache, tokencache.go, or an estimate
// calibrated against the usage backends report, estimate.go) and sizes the
// output (max_tokens, else the model's default, else the rest of the
// context). That is the reservation (reservation.go): per prompt its
// tokens, the output it may generate and its sequences, in the model's KV
// blocks (package kvbudget), described to the scheduler as a shape.
//
// Then it takes the loop's first turn (turn): it waits in its model's
// queue (package admission: priority classes, tenants, bounded queue,
// early shedding with Retry-After) until one of the model's GPUs has room
// for it — under the predicted policy, room for the forecast of its
// growth beside the others' — and is bound there; it is forwarded to a
// backend of that GPU (forward.go); and a stream's first event is read,
// the 200 promised only once it is here (a backend that sends none within
// first_byte_timeout gives a 504). Whichever turn fails, failure makes
// its error the client's answer: an OpenAI error with its status and
// Retry-After before the stream (refuse.go, in the shape errors.go
// writes), an error event in it.
//
// A non-streamed answer is passed whole (exchange.go); a streamed one is
// relayed event by event (relay.go: events cut by package internal/sse,
// told apart without a parse by package internal/chunkscan, written on
// fasthttp's connection goroutine by the relay's body), flushed as they
// arrive, while the relay reports each choice's progress and end to its
// ticket (tally.go). A stream is a success once [DONE] reached the
// client; one that ends otherwise gets a final error event and is a
// failure. A stream the admission guard stops
// (the GPU's running requests outgrew their forecast) is cut upstream;
// the relay reports it stopped, and the continuation — sent again from
// where it was — takes another turn of the same loop once it fits, its
// client seeing a pause (resume.go). What an answer reports it used
// (tally.go) calibrates the estimate, checks the tokenize cache, teaches
// the output-length predictor and feeds the metrics.
//
// The exchange (exchange.go) is the request's life: its ticket, its
// context, its client watch and the one finish. Its counting (tally,
// tally.go), its relay (relay, relay.go) and what is recorded of it
// (records, records.go: its access line, its span, its series) are types
// of their own.
//
// The pooling routes (embeddings, pooling, classify, score, rerank;
// pooling.go) take the same steps with their own reading of
// the body (parse_pooling.go): each input is a prompt, and its reservation
// is the prompt's blocks alone, held to the end of the answer, since a
// backend runs it as one prefill and decodes nothing.
//
// The Responses and Messages APIs (generation.go) take
// chat's steps too: vLLM runs each as a chat, so its prompt is read into
// a chat's shape (parse_generation.go) and its output reserved up to
// its length field. Their streams are typed events, read by their own
// inspector (relay_responses.go): each delta a token, the last event the
// end, as [DONE] is chat's; they are stopped by the guard but never
// resumed. Messages' errors are in Anthropic's shape.
//
// # Invariants
//
// Every request leaves through exactly one finish (exchange.go), which
// releases its reservation, stops watching its client, cancels its
// upstream exchange, writes its access-log line and ends its spans (the
// request's records, records.go). A client hang-up (noticed through
// package connwatch even while the request is queued or waiting for a
// non-streamed answer), a request timeout and a shutdown all end the
// request's context (reqCtx in exchange.go; its deadlines are checked by
// the sweep of the requests in flight, inflight.go), and an ended context
// closes the upstream connection, which is how the backend learns to
// abort. A choice that finishes early gives its blocks back at once. A
// request reads the configuration once (an immutable runtime, runtime.go)
// and a reload swaps in a new one, keeping the budgets and backends that
// persist, so reservations in flight survive it.
//
// # Failures and retries
//
// A request whose backend fails before the first byte is retried on
// another backend of its GPU, and once on another GPU (its ticket moved,
// never held twice; forward.go). After every probe the gateway tells the
// scheduler which GPUs may take each model's requests (runtime.go). A
// backend that answers out of memory puts its GPU on worst-case admission
// for the cool-down (exchange.go).
//
// # What else is on the GPU
//
// The GPU memory watch (gpuwatch.go, its series metrics_gpu.go, its
// section config_gpuwatch.go) reads each GPU's memory and the processes
// holding it, from NVML or the GPU node, on the gateway's clock; the
// backends' own processes are those behind their URL's port. While a GPU's
// free memory is under gpu_watch.free_floor its budget is cut by the
// difference: one named input of budgetOf, beside the reported pool.
// Contention, the floor, residue, a smaller pool after a restart and an
// out-of-memory answer each log a warning carrying the snapshot. Without a
// source nothing changes.
//
// # Operating it
//
// The server, its routes and its probes are server.go; the configuration
// and its checks config*.go, every key's default one row of one table
// (configdefaults.go, which the README's reference is held to), and Check
// (check.go) reports what a configuration builds; the operator's /status view is status.go and the
// Prometheus series metrics.go (fed as requests pass, records.go), metrics_collect.go
// (seeded and read at scrape time) and metrics_sharedbudget.go (a replica's
// shared budget, whose leases and fair shares are the fleet code's). Secrets
// never reach a client or a log (secrets.go). On SIGTERM (Drain, drain.go)
// readiness turns first and the listener serves on for server.drain_delay,
// so that load balancers stop sending before it closes; then the requests
// in flight get server.shutdown_timeout to finish.
//
// # What it does not do
//
// Retry after the first byte reached the client, or enforce separate pools
// for several vLLM processes that share one GPU budget.
package gateway
