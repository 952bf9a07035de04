// Command overhead measures what a proxy in front of an LLM backend costs:
// the same closed-loop load, driven in one run at the backend itself
// (direct), at nginx as a plain keep-alive reverse proxy, and at kvgate,
// all three in front of the same instant backend (kvgate sim
// --time-scale 0, whose engine is free, so that only HTTP work is left).
// With --fasthttp it also drives a fourth target, the floor: a bare
// reverse proxy made of fasthttp alone (`overhead floor`), which forwards
// and relays as nginx does and nothing more. kvgate is built on fasthttp,
// so the floor is about the best a proxy of its design can hope for:
// fasthttp/nginx is what the library costs, kvgate/fasthttp what the
// gateway's own work costs on top of it.
//
// run.sh starts the servers (the floor among them) and runs this command;
// it can also be pointed at any OpenAI-compatible URLs.
//
// Model. A cell is one (connections, streamed or not, prompt size). Each
// connection sends one request after the other for the cell's duration
// (closed loop); requests that start in the warm-up are not counted. The
// targets take turns within a cell, who goes first rotating, and the whole
// sweep repeats for several rounds, so that a busy moment of a shared
// machine falls on all of them alike; each target's latencies are pooled
// over the rounds.
// Latency is arrival of the last byte (the stream's end, for SSE), so a
// proxy's "added latency" is its p50 (p99) minus the direct p50 (p99) of
// the same cell.
//
// With the servers' pids (run.sh gives them), each cell also reads the CPU
// time of each server's processes, their children included, over its
// measured window, and a second table gives it per request: on a machine
// whose cores the load generator, the backend and the proxy share, a
// proxy's throughput follows from it.
//
// It does not judge: it prints the table (with the kvgate/nginx ratios,
// and fasthttp/nginx and kvgate/fasthttp when the floor is measured)
// and the machine, and exits non-zero only when a request failed or a
// target could not be reached, since a number measured over errors would
// mean nothing.
package main
