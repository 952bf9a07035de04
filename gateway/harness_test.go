package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/backends/sim"
)

// Test harness: real loopback servers, the simulated vLLM behind the real
// gateway, as STYLE.md asks.

// startSim runs a simulated vLLM (Llama-3-8B on a 24 GiB GPU unless mut
// changes it) at 100× real time.
func startSim(t testing.TB, mut func(*sim.Config)) (*sim.Server, string) {
	t.Helper()
	s := newSim(t, mut)
	return s, serveLoopback(t, s.Serve, s.Shutdown)
}

// newSim is startSim's simulator, not yet serving.
func newSim(t testing.TB, mut func(*sim.Config)) *sim.Server {
	t.Helper()
	cfg := sim.Config{TimeScale: 0.01, Seed: 1}
	if mut != nil {
		mut(&cfg)
	}
	s, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serveLoopback serves on a fresh loopback port until the test ends.
func serveLoopback(t testing.TB, serve func(net.Listener) error, shutdown func(context.Context) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

// baseConfig is a gateway config for one Llama-3-8B backend at url; extra
// is YAML appended at the top level (admission:, tenants:, ...).
func baseConfig(url, extra string) string { return fleetConfig(extra, url) }

// fleetConfig is a gateway config for one Llama-3-8B model served by a
// backend at each URL, on a GPU of its own: gpu0, gpu1, ... A URL may be
// followed by a space and its GPU's memory ("http://... 80GiB"; 24GiB
// otherwise), and that by more keys of the backend on lines of their own
// ("http://... 24GiB\n    stream_usage: final"). extra is YAML appended
// at the top level.
//
// A probe's timeout runs on the test's clock, which tests move by seconds
// at once (past a tokenize or request timeout). A probe in flight while
// the clock moves would time out on it, though the backend answered in
// real milliseconds, and two such probes open the circuit: the request the
// test is about then finds no backend (a 502). An hour is past every move.
func fleetConfig(extra string, urls ...string) string {
	var b strings.Builder
	b.WriteString(`listen: 127.0.0.1:0
models:
  - name: llama-3-8b
    geometry: {layers: 32, kv_heads: 8, head_dim: 128, dtype: bfloat16}
    weights_bytes: 16060522496
    max_model_len: 8192
    tokenizer: backend
backends:
`)
	for i, u := range urls {
		url, memory, ok := strings.Cut(u, " ")
		if !ok {
			memory = "24GiB"
		}
		fmt.Fprintf(&b, `  - name: gpu%d
    url: %s
    models: [llama-3-8b]
    gpu_memory: %s
    health: {interval: 50ms, timeout: 1h, failures: 2, cooldown: 200ms}
    metrics: {interval: 50ms}
`, i, url, memory)
	}
	b.WriteString(extra)
	return b.String()
}

// startGateway serves cfgYAML on a loopback port.
func startGateway(t testing.TB, cfgYAML string, opt Options) (*Server, string) {
	t.Helper()
	cfg, err := Parse([]byte(cfgYAML), ".")
	if err != nil {
		t.Fatalf("config: %v\n%s", err, cfgYAML)
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := New(cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	return s, serveLoopback(t, s.Serve, s.Shutdown)
}

// gpuStats is the stats of the GPU named gpu (its group in the config).
func gpuStats(s *Server, gpu string) admission.GPUStats {
	rt := s.rt.Load()
	st, _ := rt.sched.GPU(rt.gpus[gpu].id)
	return st
}

// heldEverywhere is the worst-case bytes reserved on every GPU together,
// those a reload removed (whose tickets are still draining) included: what
// every model's classes hold.
func heldEverywhere(s *Server) int64 {
	var h int64
	for _, q := range s.rt.Load().sched.Stats().Queues {
		for _, c := range q.Classes {
			h += c.Held
		}
	}
	return h
}

// onlyGPU is the stats of the gateway's only GPU.
func onlyGPU(s *Server) admission.GPUStats {
	return s.rt.Load().sched.Stats().GPUs[0]
}

// held is the worst-case bytes reserved on the gateway's only GPU.
func held(s *Server) int64 { return onlyGPU(s).Held }

// eventually polls cond on the wall clock until it holds, and says how long
// that took; past a minute it logs each state and fails. It waits for what
// another goroutine or process does in its own time — a release right after
// the last byte reaches the client, a backend's answer, a lease from Redis
// — never for the gateway's clock to pass a deadline: a test that needs
// that holds a manual clock and advances it (advanceUntil).
func eventually(t testing.TB, what string, cond func() bool, state ...func() string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			for _, st := range state {
				t.Log(st())
			}
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// advanceUntil moves clock on by step until cond holds. A deadline the
// clock passes is acted on by the gateway's sweep in its own goroutine,
// after Advance returns; and a sweep that read the clock just before an
// Advance sleeps from that reading, so the next step wakes it. step is
// what the test allows the gateway to be late by.
func advanceUntil(t testing.TB, clock *admissiontest.Clock, step time.Duration, what string, cond func() bool) {
	t.Helper()
	eventually(t, what, func() bool {
		if cond() {
			return true
		}
		clock.Advance(step)
		return false
	})
}

// newClock is a manual clock for the gateway's Options.
func newClock() *admissiontest.Clock { return admissiontest.NewClock(time.Unix(1e9, 0)) }

// words makes a prompt of n sim tokens (" abc" is one token there).
func words(n int) string { return strings.Repeat(" abc", n) }

func chatBody(prompt string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model":      "llama-3-8b",
		"messages":   []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": maxTokens,
		"stream":     stream,
	})
	return string(b)
}

var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}, Timeout: 60 * time.Second}

type result struct {
	status     int
	retryAfter string
	header     http.Header
	body       string
	err        error
}

// rawExchange sends req — request line, headers and any body, as bytes —
// on a connection of its own, all of it before reading, as Python's
// clients do, and returns the answer's status and body.
func rawExchange(t testing.TB, gwURL, req string) (int, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("writing the request: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer's body: %v", err)
	}
	return resp.StatusCode, b
}

func postJSON(url, path, body string, header ...string) result {
	req, err := http.NewRequest("POST", url+path, strings.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), header: resp.Header, body: string(b), err: err}
}

// errorBody decodes an OpenAI error body.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeError(t testing.TB, body string) errorBody {
	t.Helper()
	var e errorBody
	if err := json.NewDecoder(bytes.NewReader([]byte(body))).Decode(&e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body (%v): %s", err, body)
	}
	return e
}
