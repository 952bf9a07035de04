package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

// The official OpenAI Go client works through the gateway: chat and
// completions, streamed and not.
func TestOpenAIClientThroughGateway(t *testing.T) {
	backend, url := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	client := openai.NewClient(option.WithBaseURL(gwURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()

	chat, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     "llama-3-8b",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello in five words.")},
		MaxTokens: openai.Int(5),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(chat.Choices) != 1 || chat.Choices[0].Message.Content == "" || chat.Usage.CompletionTokens != 5 {
		t.Errorf("chat: %+v", chat)
	}

	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:     "llama-3-8b",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Count to ten.")},
		MaxTokens: openai.Int(10),
	})
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		c := stream.Current()
		acc.AddChunk(c)
		chunks++
		if c.JSON.Usage.Valid() && c.Usage.TotalTokens > 0 {
			t.Error("the client did not ask for usage, yet a usage chunk reached it")
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 10 || acc.Choices[0].Message.Content == "" || acc.Choices[0].FinishReason != "length" {
		t.Errorf("stream: %d chunks, %+v", chunks, acc.Choices)
	}

	// A client that asks for usage gets it, once.
	stream = client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         "llama-3-8b",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hi")},
		MaxTokens:     openai.Int(3),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	usageChunks := 0
	for stream.Next() {
		if u := stream.Current().Usage; u.CompletionTokens == 3 {
			usageChunks++
		}
	}
	if err := stream.Err(); err != nil || usageChunks != 1 {
		t.Errorf("include_usage: %d usage chunks, err %v", usageChunks, err)
	}

	comp, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel("llama-3-8b"),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens: openai.Int(7),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(comp.Choices) != 1 || comp.Choices[0].Text == "" || comp.Usage.CompletionTokens != 7 {
		t.Errorf("completion: %+v", comp)
	}
	cs := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel("llama-3-8b"),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens: openai.Int(4),
		N:         openai.Int(2),
	})
	texts := map[int64]string{}
	for cs.Next() {
		for _, c := range cs.Current().Choices {
			texts[c.Index] += c.Text
		}
	}
	if err := cs.Err(); err != nil || len(texts) != 2 || texts[0] == "" || texts[1] == "" {
		t.Errorf("streamed completion n=2: %v %v", texts, err)
	}

	models, err := client.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "llama-3-8b" {
		t.Errorf("models: %+v %v", models, err)
	}
	eventually(t, "reservations to return", func() bool { return held(gw) == 0 })
	if st := backend.Stats(); st.Running != 0 || st.UsedBlocks != 0 {
		t.Errorf("backend still busy: %+v", st)
	}
}

// Every error the gateway itself gives, in OpenAI's shape with the right
// status, and a backend's own error passed through.
func TestErrors(t *testing.T) {
	_, url := startSim(t, nil)
	extra := `server: {max_body_bytes: 64KiB}
tenants:
  - {name: a, api_keys: [key-a], class: standard}
`
	gw, gwURL := startGateway(t, baseConfig(url, extra), Options{})
	auth := []string{"Authorization", "Bearer key-a"}
	big := `{"model":"llama-3-8b","messages":[{"role":"user","content":"` + strings.Repeat("x", 70<<10) + `"}]}`
	tests := []struct {
		name   string
		path   string
		body   string
		header []string
		status int
		code   string
		param  string
	}{
		{"no key", "/v1/chat/completions", chatBody("hi", 5, false), nil, 401, "invalid_api_key", ""},
		{"wrong key", "/v1/chat/completions", chatBody("hi", 5, false), []string{"Authorization", "Bearer nope"}, 401, "invalid_api_key", ""},
		{"invalid json", "/v1/chat/completions", `{"model":`, auth, 400, "", ""},
		{"not an object", "/v1/chat/completions", `[1]`, auth, 400, "", ""},
		{"missing model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, auth, 400, "", "model"},
		{"no messages", "/v1/chat/completions", `{"model":"llama-3-8b"}`, auth, 400, "", "messages"},
		{"empty messages", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[]}`, auth, 400, "", "messages"},
		{"message without role", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"content":"x"}]}`, auth, 400, "", "messages[0].role"},
		{"max_tokens zero", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":0}`, auth, 400, "", "max_tokens"},
		{"max_tokens string", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":"9"}`, auth, 400, "", "max_tokens"},
		{"n zero", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","n":0}`, auth, 400, "", "n"},
		{"stream not bool", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","stream":"yes"}`, auth, 400, "", "stream"},
		{"no prompt", "/v1/completions", `{"model":"llama-3-8b"}`, auth, 400, "", "prompt"},
		{"unknown model", "/v1/chat/completions", strings.Replace(chatBody("hi", 5, false), "llama-3-8b", "gpt-9", 1), auth, 404, "model_not_found", "model"},
		{"over max_model_len", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":9000}`, auth, 400, "context_length_exceeded", "max_tokens"},
		{"prompt and output over max_model_len", "/v1/completions", `{"model":"llama-3-8b","prompt":[1,2,3],"max_tokens":8190}`, auth, 400, "context_length_exceeded", "prompt"},
		{"bigger than the budget", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":8000,"n":16}`, auth, 400, "kv_budget_exceeded", "max_tokens"},
		{"bad priority", "/v1/chat/completions", chatBody("hi", 5, false), append([]string{"X-Priority", "vip"}, auth...), 400, "", "X-Priority"},
		{"body too large", "/v1/chat/completions", big, auth, 413, "request_too_large", ""},
		{"unknown path", "/v1/nothing-here", `{}`, auth, 404, "unknown_url", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := postJSON(gwURL, tt.path, tt.body, tt.header...)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
			e := decodeError(t, r.body)
			if tt.code != "" && (e.Error.Code == nil || *e.Error.Code != tt.code) {
				t.Errorf("code %v, want %s", e.Error.Code, tt.code)
			}
			if tt.param != "" && (e.Error.Param == nil || *e.Error.Param != tt.param) {
				t.Errorf("param %v, want %s", e.Error.Param, tt.param)
			}
			// The official clients retry 5xx and 429 unless told not to;
			// a request that can never fit is a 400, and says so too.
			if tt.code == "kv_budget_exceeded" && r.header.Get("X-Should-Retry") != "false" {
				t.Errorf("X-Should-Retry %q", r.header.Get("X-Should-Retry"))
			}
		})
	}
	if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 3, false), auth...); r.status != 200 {
		t.Errorf("a good request after the bad ones: %d %s", r.status, r.body)
	}
	if held(gw) != 0 {
		t.Errorf("rejected requests left %d bytes held", held(gw))
	}
	// GET on a POST route.
	resp, err := http.Get(gwURL + "/v1/chat/completions")
	if err != nil || resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET chat: %v %v", resp, err)
	}
}

// A backend's own error answer (here the simulator's vLLM-style 400 for a
// prompt it cannot take) is passed through with its status and body.
func TestBackendErrorPassedThrough(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.MaxModelLen = 100 })
	// The gateway believes the model takes 8192 tokens, the backend 100.
	_, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	r := postJSON(gwURL, "/v1/chat/completions", chatBody(words(200), 10, false))
	if r.status != 400 || !strings.Contains(r.body, "maximum context length") {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
}

// No healthy backend: 503, and /readyz says so. The health checks' interval
// runs on the gateway's clock, which the test moves.
func TestNoHealthyBackend(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	clock := newClock()
	gw, gwURL := startGateway(t, baseConfig(dead, ""), Options{Clock: clock})
	// Two failed checks (health.failures), one interval (50ms) apart.
	advanceUntil(t, clock, 50*time.Millisecond, "the circuit to open", func() bool { return !gw.rt.Load().upstreams.Ready() })
	r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 5, false))
	if r.status != 503 || decodeError(t, r.body).Error.Code == nil {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	resp, err := http.Get(gwURL + "/readyz")
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("readyz: %v %v", resp, err)
	}
	resp, err = http.Get(gwURL + "/health")
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp, err = http.Get(gwURL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
}

// A request that outlives server.request_timeout gets 504 and its
// reservation back; a stream under way ends with an error event instead.
// The timeout runs on the gateway's clock, which the test moves.
func TestUpstreamTimeout(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 }) // real time: 200 tokens take seconds
	clock := newClock()
	// Longer than the answer takes in real time: only the clock can end it.
	gw, gwURL := startGateway(t, baseConfig(url, "server: {request_timeout: 30s}\n"), Options{Clock: clock})
	got := make(chan result, 1)
	go func() { got <- postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 200, false)) }()
	eventually(t, "the request to be admitted", func() bool { return held(gw) > 0 })
	clock.Advance(30 * time.Second)
	var r result
	advanceUntil(t, clock, sweepTick, "the 504", func() bool {
		select {
		case r = <-got:
			return true
		default:
			return false
		}
	})
	if r.status != 504 || decodeError(t, r.body).Error.Type != typeServer {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	// It went back admission.abort_hold (1s) after the exchange was cut.
	advanceUntil(t, clock, time.Second, "the reservation to return", func() bool { return held(gw) == 0 })

	resp, err := httpClient.Post(gwURL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hi", 200, true)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	readUntil(t, br, "data: ") // under way
	rest := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(br); rest <- b }()
	clock.Advance(30 * time.Second)
	var tail []byte
	advanceUntil(t, clock, sweepTick, "the stream to end", func() bool {
		select {
		case tail = <-rest:
			return true
		default:
			return false
		}
	})
	if resp.StatusCode != 200 || !strings.Contains(string(tail), `"upstream_timeout"`) || !strings.HasSuffix(string(tail), "data: [DONE]\n\n") {
		t.Fatalf("stream timeout: %d %s", resp.StatusCode, tail)
	}
}

// 429s carry a reason code and Retry-After: a sheddable request under
// pressure (overloaded), a class that never queues (queue_full), a waiter
// whose class deadline passes (queue_timeout). A tenant asking for more than
// its whole share gets tenant_quota without Retry-After: waiting cannot help.
// The queue's deadline runs on the gateway's clock, which the test moves.
func TestShedReasons(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 }) // real time: the filler requests stay admitted
	extra := `admission:
  classes:
    - {name: critical, timeout: 30s}
    - {name: standard, max_requests: -1}
    - {name: sheddable}
tenants:
  - {name: small, api_keys: [key-small], share: 0.3}
  - {name: big, api_keys: [key-big], share: 1, class: critical}
`
	clock := newClock()
	gw, gwURL := startGateway(t, baseConfig(url, extra), Options{Clock: clock})
	big := []string{"Authorization", "Bearer key-big"}
	// Two requests of ~7990 tokens, 500 blocks each: 1000 of the budget's 1045.
	fill := make(chan result, 2)
	for range 2 {
		go func() {
			fill <- postJSON(gwURL, "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":7990}`, big...)
		}()
	}
	eventually(t, "the filler requests to be admitted", func() bool { return held(gw) >= 1000*(2<<20) })

	cases := []struct {
		name   string
		body   string
		header []string
		code   string
		retry  bool
		msg    string        // in the message
		queued time.Duration // how long it waits in the queue, on the clock, before its answer
	}{
		{"sheddable under pressure", `{"model":"llama-3-8b","prompt":"hi","max_tokens":5}`, append([]string{"X-Priority", "sheddable"}, big...), "overloaded", true, "being shed", 0},
		{"never-queue class without room", `{"model":"llama-3-8b","prompt":"hi","max_tokens":1600}`, append([]string{"X-Priority", "standard"}, big...), "queue_full", true,
			"queueing is disabled (admission.classes[1].max_requests is negative)", 0},
		{"deadline passes in the queue", `{"model":"llama-3-8b","prompt":"hi","max_tokens":1600}`, big, "queue_timeout", true, "queue deadline", 30 * time.Second},
		{"tenant over its whole share", `{"model":"llama-3-8b","prompt":"hi","max_tokens":6000}`, []string{"Authorization", "Bearer key-small"}, "tenant_quota", false, "your tenant", 0},
	}
	for _, c := range cases {
		var r result
		if c.queued > 0 {
			answer := make(chan result, 1)
			go func() { answer <- postJSON(gwURL, "/v1/completions", c.body, c.header...) }()
			admissiontest.WaitQueued(gw.sched, 1)
			clock.Advance(c.queued - time.Nanosecond)
			if n := gw.sched.Stats().Queued; n != 1 {
				t.Errorf("%s: %d queued a nanosecond before the deadline", c.name, n)
			}
			clock.Advance(time.Nanosecond)
			r = <-answer
		} else {
			r = postJSON(gwURL, "/v1/completions", c.body, c.header...)
		}
		if r.status != 429 {
			t.Errorf("%s: status %d: %s", c.name, r.status, r.body)
			continue
		}
		e := decodeError(t, r.body)
		if e.Error.Code == nil || *e.Error.Code != c.code || e.Error.Type != typeRateLimit || !strings.Contains(e.Error.Message, c.msg) {
			t.Errorf("%s: %+v", c.name, e.Error)
		}
		ms, msErr := strconv.Atoi(r.header.Get("Retry-After-Ms"))
		if s, err := strconv.Atoi(r.retryAfter); c.retry && (err != nil || s < 1 || msErr != nil || ms < 1 || ms > 1000*s) {
			t.Errorf("%s: Retry-After %q, Retry-After-Ms %q", c.name, r.retryAfter, r.header.Get("Retry-After-Ms"))
		} else if !c.retry && (r.retryAfter != "" || r.header.Get("X-Should-Retry") != "false") {
			t.Errorf("%s: Retry-After %q, X-Should-Retry %q on a refusal that waiting cannot cure", c.name, r.retryAfter, r.header.Get("X-Should-Retry"))
		}
	}
	// Shutting down past its timeout cancels what is still running; the
	// reservations must all come back. Wall time: Shutdown's ctx bounds
	// fasthttp's wait for its connections.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	gw.Shutdown(ctx)
	for range 2 {
		if r := <-fill; r.status != 503 {
			t.Errorf("filler after forced shutdown: %d %s", r.status, r.body)
		}
	}
	// They went back admission.abort_hold (1s) after the exchanges were cut.
	advanceUntil(t, clock, time.Second, "reservations to return", func() bool { return held(gw) == 0 })
}

// Unknown fields pass through to the backend untouched, and the gateway
// adds include_usage for itself only.
func TestBodyForwardedUnchanged(t *testing.T) {
	got := make(chan []byte, 4)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/tokenize":
			ctx.WriteString(`{"count":3,"max_model_len":8192,"tokens":[1,2,3]}`)
		case "/health", "/metrics":
		default:
			got <- append([]byte(nil), ctx.PostBody()...)
			ctx.SetContentType("application/json")
			ctx.WriteString(`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
		}
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()
	_, gwURL := startGateway(t, baseConfig("http://"+ln.Addr().String(), ""), Options{})
	body := `{"model":"llama-3-8b",  "messages":[{"role":"user","content":"hi"}],"temperature":0.3,"x_custom":{"a":[1,2]},"max_tokens":4}`
	if r := postJSON(gwURL, "/v1/chat/completions", body); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if b := <-got; string(b) != body {
		t.Errorf("non-streaming body changed:\n got %s\nwant %s", b, body)
	}
	stream := `{"model":"llama-3-8b","stream":true,"messages":[{"role":"user","content":"hi"}],"x_custom":1}`
	postJSON(gwURL, "/v1/chat/completions", stream)
	b := <-got
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m["x_custom"] != 1.0 || m["stream_options"].(map[string]any)["include_usage"] != true {
		t.Errorf("streaming body: %s", b)
	}
	// Usage on every chunk too: the gateway counts what the backend counts.
	if want := `"stream_options":{"include_usage":true,"continuous_usage_stats":true},` + stream[1:]; string(b) != "{"+want {
		t.Errorf("streaming body should be the client's with one key spliced in:\n got %s", b)
	}
}

func TestModelsAndStatus(t *testing.T) {
	_, url := startSim(t, nil)
	_, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	resp, err := http.Get(gwURL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if len(models.Data) != 1 || models.Data[0].ID != "llama-3-8b" || models.Data[0].MaxModelLen != 8192 {
		t.Errorf("models: %+v", models)
	}
	resp, err = http.Get(gwURL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var st statusView
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	// Every key of the operator's JSON is snake_case, however deep: a Go
	// field name leaking through (a struct without tags) would break the
	// scripts that read it when the field is renamed.
	var tree any
	_ = json.Unmarshal(raw, &tree)
	snakeKeys(t, "status", tree)
	if len(st.GPUs) != 1 || st.GPUs[0].Capacity != 2193088512 || len(st.Models) != 1 || len(st.Models[0].Classes) != 3 || st.ModelInfo[0].BytesPerToken != 131072 {
		t.Errorf("status: %+v", st)
	}
	resp, err = http.Get(gwURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	buf := make([]byte, 1<<16)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if errors.Is(err, context.Canceled) || err != nil {
			break
		}
	}
	resp.Body.Close()
	for _, name := range []string{"kvgate_kv_capacity_bytes", "kvgate_kv_held_bytes", "kvgate_queue_depth", "kvgate_backend_up"} {
		if !strings.Contains(sb.String(), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// A panic in a handler is recovered, logged with its stack (issue 26,
// R10: the log said only "boom", not where), and answered with a 500 in
// OpenAI's shape; the server keeps serving.
func TestPanicIsRecovered(t *testing.T) {
	_, url := startSim(t, nil)
	var logs syncbuf.Buffer
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	var once atomic.Bool
	gw.testHookServe = func() {
		if once.CompareAndSwap(false, true) {
			panic("boom")
		}
	}
	r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 2, false))
	if r.status != 500 || decodeError(t, r.body).Error.Type != typeServer {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 2, false)); r.status != 200 {
		t.Fatalf("after the panic: %d %s", r.status, r.body)
	}
	var rec struct{ Msg, Panic, Stack string }
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"panic"`) {
			_ = json.Unmarshal([]byte(line), &rec)
		}
	}
	if rec.Panic != "boom" || !strings.Contains(rec.Stack, "TestPanicIsRecovered") {
		t.Errorf("the panic's log record has no stack through the panicking code: %+v\n%s", rec, logs.String())
	}
}

func snakeKeys(t *testing.T, path string, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if strings.Trim(k, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" && !strings.HasPrefix(path, "status.admission.rejected") {
				t.Errorf("%s.%s: not a snake_case key", path, k)
			}
			snakeKeys(t, path+"."+k, e)
		}
	case []any:
		for i, e := range v {
			snakeKeys(t, fmt.Sprintf("%s[%d]", path, i), e)
		}
	}
}

// A request too large to admit is told how to make it smaller; one that
// sets no length is told that this is why, since without max_tokens the
// whole remaining context is reserved (LangChain and the AI SDK omit it).
func TestTooLargeSaysWhatToLower(t *testing.T) {
	_, url := startSim(t, nil)
	_, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	for _, tc := range []struct{ body, want string }{
		{`{"model":"llama-3-8b","prompt":"hi","n":4}`, "Set max_tokens or max_completion_tokens: without it the whole remaining context"},
		{`{"model":"llama-3-8b","prompt":"hi","max_tokens":8000,"n":16}`, "Lower max_tokens or n"},
	} {
		r := postJSON(gwURL, "/v1/completions", tc.body)
		if r.status != 400 || !strings.Contains(decodeError(t, r.body).Error.Message, tc.want) {
			t.Errorf("%s: %d %s; want a 400 saying %q", tc.body, r.status, r.body, tc.want)
		}
	}
}

// A trailing slash names the same route, as vLLM takes it; an unknown URL's
// 404 names the routes that are served.
func TestRouteSlashAndUnknownURL(t *testing.T) {
	_, url := startSim(t, nil)
	_, gw := startGateway(t, baseConfig(url, ""), Options{})
	if r := postJSON(gw, "/v1/chat/completions/", chatBody("hi", 3, false)); r.status != 200 {
		t.Errorf("trailing slash: %d %s", r.status, r.body)
	}
	r := postJSON(gw, "/v1/nope", `{}`)
	if e := decodeError(t, r.body); r.status != 404 || !strings.Contains(e.Error.Message, "POST /v1/chat/completions") || !strings.Contains(e.Error.Message, "/v1/nope") {
		t.Errorf("unknown URL: %d %s", r.status, r.body)
	}
}
