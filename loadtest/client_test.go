package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// sseServer answers every request with the given SSE lines, flushing after
// each event, and hands the decoded request body to check.
func sseServer(t *testing.T, events []string, check func(r *http.Request, body map[string]any)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Errorf("request body is not JSON: %v: %s", err, raw)
		}
		if check != nil {
			check(r, body)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			fmt.Fprint(w, e)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func testSender(url string, clock Clock) *httpSender {
	return &httpSender{client: NewHTTPClient(8), url: url, model: "m", chat: true, stream: true, ignoreEOS: true, clock: clock}
}

func TestSenderMeasuresTheStreamExactly(t *testing.T) {
	events := []string{
		`data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n",
		`data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}],"usage":null}` + "\n\n",
		`data: {"id":"c1","choices":[{"index":0,"delta":{"content":" world"},"finish_reason":null}]}` + "\n\n",
		": a heartbeat comment\n\n",
		`data: {"id":"c1","choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"length"}]}` + "\n\n",
		`data: {"id":"c1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}` + "\n\n",
		"data: [DONE]\n\n",
	}
	srv := sseServer(t, events, func(r *http.Request, body map[string]any) {
		if got := r.Header.Get("Authorization"); got != "Bearer sk-test" {
			t.Errorf("Authorization = %q", got)
		}
		if r.URL.Path != "/v1/chat/completions" {
			t.Errorf("path %s", r.URL.Path)
		}
		msgs, _ := body["messages"].([]any)
		if len(msgs) != 1 || msgs[0].(map[string]any)["content"] != "the prompt" || msgs[0].(map[string]any)["role"] != "user" {
			t.Errorf("messages = %v", body["messages"])
		}
		so, _ := body["stream_options"].(map[string]any)
		if body["model"] != "m" || body["max_tokens"] != 3.0 || body["stream"] != true || so["include_usage"] != true ||
			body["ignore_eos"] != true || body["min_tokens"] != 3.0 {
			t.Errorf("body = %v", body)
		}
	})
	// One millisecond a clock reading: the start is reading 1, then one
	// reading a line: role (2), blank (3), "Hello" (4), blank (5), " world"
	// (6), blank (7), comment (8), blank (9), "!" (10), blank (11), usage
	// (12), blank (13), [DONE] (14).
	s := testSender(srv.URL+"/v1/chat/completions", &stepClock{step: time.Millisecond})
	s.apiKey = "sk-test"
	r := s.Send(context.Background(), RequestSpec{Index: 7, Prompt: "the prompt", PromptTokens: 10, MaxTokens: 3})
	if r.Outcome != OutcomeOK {
		t.Fatalf("outcome %s: %s", r.Outcome, r.Err)
	}
	if got := r.TTFT(); got != 3*time.Millisecond {
		t.Errorf("TTFT = %s, want 3ms (role-only chunk not counted)", got)
	}
	if want := []time.Duration{2 * time.Millisecond, 4 * time.Millisecond}; !slices.Equal(r.ITL, want) {
		t.Errorf("ITL = %v, want %v", r.ITL, want)
	}
	if got := r.E2E(); got != 13*time.Millisecond {
		t.Errorf("E2E = %s, want 13ms", got)
	}
	if r.OutputTokens != 3 || r.PromptTokens != 12 || r.Index != 7 {
		t.Errorf("tokens out %d prompt %d index %d; want 3, 12 (from usage), 7", r.OutputTokens, r.PromptTokens, r.Index)
	}
}

// A reasoning model's first output is reasoning and a tool call's is
// arguments: each is a generated token, for the time to the first one, the
// gaps between them and (with no usage) the count.
func TestSenderCountsReasoningAndToolCalls(t *testing.T) {
	srv := sseServer(t, []string{
		`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"reasoning":"Hmm"},"finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"reasoning_content":" so"},"finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"weather","arguments":""}}]},"finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[]},"finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"tool_calls"}]}` + "\n\n",
		"data: [DONE]\n\n",
	}, nil)
	// One millisecond a clock reading: the start is reading 1, then one a
	// line: role (2), blank (3), reasoning (4), blank (5), reasoning (6),
	// blank (7), tool call (8), blank (9), empty tool calls (10), blank
	// (11), content (12), blank (13), [DONE] (14).
	r := testSender(srv.URL, &stepClock{step: time.Millisecond}).Send(context.Background(), RequestSpec{Prompt: "p", MaxTokens: 8})
	if r.Outcome != OutcomeOK {
		t.Fatalf("outcome %s: %s", r.Outcome, r.Err)
	}
	if got := r.TTFT(); got != 3*time.Millisecond {
		t.Errorf("TTFT = %s, want 3ms (the first reasoning)", got)
	}
	if want := []time.Duration{2 * time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond}; !slices.Equal(r.ITL, want) {
		t.Errorf("ITL = %v, want %v", r.ITL, want)
	}
	if r.OutputTokens != 4 {
		t.Errorf("%d output tokens, want 4", r.OutputTokens)
	}
}

func TestSenderCompletionsAndNoUsage(t *testing.T) {
	// /v1/completions chunks carry "text"; with no usage chunk the output
	// is counted one token a content chunk, and a finish_reason without
	// [DONE] is still a complete response.
	srv := sseServer(t, []string{
		`data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"text":"b","finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"text":"c","finish_reason":"stop"}]}` + "\n\n",
	}, func(_ *http.Request, body map[string]any) {
		if body["prompt"] != "p" || body["messages"] != nil {
			t.Errorf("completions body = %v", body)
		}
		if _, ok := body["ignore_eos"]; ok {
			t.Errorf("strict OpenAI body carries ignore_eos: %v", body)
		}
	})
	s := testSender(srv.URL, &stepClock{step: time.Millisecond})
	s.chat, s.ignoreEOS = false, false
	r := s.Send(context.Background(), RequestSpec{Prompt: "p", PromptTokens: 5, MaxTokens: 3})
	if r.Outcome != OutcomeOK || r.OutputTokens != 3 || r.PromptTokens != 5 || len(r.ITL) != 2 {
		t.Errorf("got %s %q, %d tokens, prompt %d, ITL %v", r.Outcome, r.Err, r.OutputTokens, r.PromptTokens, r.ITL)
	}
}

func TestSenderOutcomes(t *testing.T) {
	oom := `{"error":{"message":"CUDA out of memory. Tried to allocate 2.00 GiB","type":"InternalServerError","param":null,"code":500}}`
	for _, tc := range []struct {
		name    string
		status  int
		ctype   string
		body    string
		want    Outcome
		wantErr string
	}{
		{"429 is shed", 429, "application/json", `{"error":{"message":"queue full, retry","type":"rate_limit"}}`, OutcomeShed, "queue full"},
		{"500 out of memory is overflow", 500, "application/json", oom, OutcomeOverflow, "CUDA out of memory"},
		{"500 other is a server error", 500, "application/json", `{"error":{"message":"engine dead"}}`, OutcomeServerError, "engine dead"},
		{"503 plain text", 503, "text/plain", "Service Unavailable", OutcomeServerError, "Service Unavailable"},
		{"503 while restarting after an OOM is refused, not overflowed", 503, "application/json",
			`{"error":{"message":"the engine is restarting after CUDA out of memory"}}`, OutcomeServerError, "restarting"},
		{"400 is a client error", 400, "application/json", `{"object":"error","message":"context length exceeded"}`, OutcomeClientError, "context length exceeded"},
		{"404 unknown model", 404, "application/json", `{"error":{"message":"The model x does not exist."}}`, OutcomeClientError, "does not exist"},
		{"stream error event: out of memory", 200, "text/event-stream",
			`data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\ndata: " + oom + "\n\ndata: [DONE]\n\n", OutcomeOverflow, "CUDA out of memory"},
		{"stream error event, named", 200, "text/event-stream",
			"event: error\ndata: engine crashed\n\n", OutcomeServerError, "engine crashed"},
		{"stream cut before [DONE]", 200, "text/event-stream",
			`data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}` + "\n\n", OutcomeConnError, "before [DONE]"},
		{"plain JSON response", 200, "application/json",
			`{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":9}}`, OutcomeOK, ""},
		{"plain JSON error with 200", 200, "application/json", `{"error":"out of memory"}`, OutcomeOverflow, "out of memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.body)
			}))
			defer srv.Close()
			r := testSender(srv.URL, SystemClock{}).Send(context.Background(), RequestSpec{Prompt: "x", MaxTokens: 4})
			if r.Outcome != tc.want {
				t.Fatalf("outcome %s (%q), want %s", r.Outcome, r.Err, tc.want)
			}
			if !strings.Contains(r.Err, tc.wantErr) {
				t.Errorf("error %q lacks %q", r.Err, tc.wantErr)
			}
			if tc.want == OutcomeOK && (r.OutputTokens != 9 || r.TTFT() != r.E2E()) {
				t.Errorf("plain response: %d tokens, ttft %s e2e %s", r.OutputTokens, r.TTFT(), r.E2E())
			}
			if r.End.Before(r.Start) {
				t.Errorf("ends before it starts")
			}
		})
	}
}

func TestSenderTimeoutCancelAndRefused(t *testing.T) {
	flushed := make(chan struct{}, 2) // a request's first event is on its way
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
		flushed <- struct{}{}
		<-r.Context().Done() // never finishes on its own
	}))
	defer hang.Close()

	s := testSender(hang.URL, SystemClock{})
	s.timeout = 50 * time.Millisecond
	if r := s.Send(context.Background(), RequestSpec{Prompt: "x", MaxTokens: 4}); r.Outcome != OutcomeTimeout || !strings.Contains(r.Err, "50ms") {
		t.Errorf("hung stream: %s %q, want timeout", r.Outcome, r.Err)
	}

	<-flushed
	ctx, cancel := context.WithCancel(context.Background())
	s.timeout = 0
	go func() { <-flushed; cancel() }() // mid-stream
	if r := s.Send(ctx, RequestSpec{Prompt: "x", MaxTokens: 4}); r.Outcome != OutcomeIncomplete {
		t.Errorf("cancelled: %s %q, want incomplete", r.Outcome, r.Err)
	}

	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	if r := testSender(url, SystemClock{}).Send(context.Background(), RequestSpec{Prompt: "x", MaxTokens: 4}); r.Outcome != OutcomeConnError {
		t.Errorf("refused: %s %q, want conn_error", r.Outcome, r.Err)
	}
}

func TestIsOOM(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want bool
	}{
		{"CUDA out of memory. Tried to allocate 20.00 MiB", true},
		{"torch.OutOfMemoryError: CUDA error", true},
		{"RuntimeError: CUDA error: an illegal memory access", false},
		{"queue full", false},
	} {
		if got := isOOM(tc.msg); got != tc.want {
			t.Errorf("isOOM(%q) = %v", tc.msg, got)
		}
	}
}

// FuzzReadStream: whatever a server streams, the reader ends in one outcome,
// never panics, and reports inter-token gaps only after a first token.
func FuzzReadStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("event: error\ndata: {\"error\":{\"message\":\"CUDA out of memory\"}}\n\n"))
	f.Add([]byte("data: {\"choices\":[{\"text\":\"x\",\"finish_reason\":\"stop\"}],\"usage\":{\"completion_tokens\":1}}"))
	f.Add([]byte(": comment\r\n\r\ndata:{}\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		s := testSender("http://unused", &stepClock{step: time.Millisecond})
		var r Result
		r.Start = t0
		ctx := context.Background()
		s.readStream(ctx, ctx, strings.NewReader(string(body)), &r, false)
		if r.Outcome < OutcomeOK || r.Outcome > OutcomeDropped {
			t.Fatalf("outcome %d", r.Outcome)
		}
		if r.FirstToken.IsZero() && len(r.ITL) > 0 {
			t.Fatalf("ITL without a first token: %v", r.ITL)
		}
		if r.End.IsZero() {
			t.Fatal("no end time")
		}
	})
}
