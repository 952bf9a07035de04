package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// serveLoopback runs a Server on a loopback port; the caller shuts it down
// and reads Serve's result from served.
func serveLoopback(t testing.TB, c Config) (s *Server, base string, served <-chan error) {
	t.Helper()
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 1)
	go func() { ch <- s.Serve(ln) }()
	return s, "http://" + ln.Addr().String(), ch
}

// startServer runs a Server on a loopback port for the test's lifetime.
func startServer(t testing.TB, c Config) (*Server, string) {
	t.Helper()
	s, base, served := serveLoopback(t, c)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s, base
}

func post(t testing.TB, url, body string) (int, []byte) {
	t.Helper()
	return readResponse(t)(http.Post(url, "application/json", strings.NewReader(body)))
}

func get(t testing.TB, url string) (int, []byte) {
	t.Helper()
	return readResponse(t)(http.Get(url))
}

func readResponse(t testing.TB) func(*http.Response, error) (int, []byte) {
	return func(resp *http.Response, err error) (int, []byte) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
}

// sseData is the data of every event of an SSE body, in order.
func sseData(t testing.TB, body []byte) []string {
	t.Helper()
	var out []string
	for ev := range bytes.SplitSeq(body, []byte("\n\n")) {
		if len(bytes.TrimSpace(ev)) == 0 {
			continue
		}
		d, ok := bytes.CutPrefix(ev, []byte("data: "))
		if !ok || bytes.Contains(d, []byte("\n")) {
			t.Fatalf("not a one-line data event: %q", ev)
		}
		out = append(out, string(d))
	}
	return out
}

type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type chunkJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
}

type fullJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         *string `json:"text"`
		FinishReason string  `json:"finish_reason"`
	} `json:"choices"`
	Usage usageJSON `json:"usage"`
}

func unmarshal(t testing.TB, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
}

// streamed reads a stream into its text per choice, its finish reasons, the
// usage chunk (if any) and whether it ended with [DONE].
type streamed struct {
	text    map[int]string
	finish  map[int]string
	roles   int
	usage   *usageJSON
	done    bool
	errData string
	events  int
}

func readStream(t testing.TB, body []byte, chat bool) streamed {
	t.Helper()
	st := streamed{text: map[int]string{}, finish: map[int]string{}}
	for _, d := range sseData(t, body) {
		st.events++
		if st.done {
			t.Fatalf("event after [DONE]: %s", d)
		}
		if d == "[DONE]" {
			st.done = true
			continue
		}
		if strings.HasPrefix(d, `{"error"`) {
			st.errData = d
			continue
		}
		var c chunkJSON
		unmarshal(t, []byte(d), &c)
		wantObj := "text_completion"
		if chat {
			wantObj = "chat.completion.chunk"
		}
		if c.Object != wantObj || c.Model != "llama-3-8b" || c.ID == "" || c.Created == 0 {
			t.Fatalf("bad chunk header: %s", d)
		}
		if c.Usage != nil {
			if len(c.Choices) != 0 || st.usage != nil {
				t.Fatalf("usage chunk with choices, or twice: %s", d)
			}
			st.usage = c.Usage
			continue
		}
		if len(c.Choices) != 1 {
			t.Fatalf("want one choice a chunk: %s", d)
		}
		ch := c.Choices[0]
		if _, ended := st.finish[ch.Index]; ended {
			t.Fatalf("chunk after the finish of choice %d: %s", ch.Index, d)
		}
		switch {
		case chat && ch.Delta != nil && ch.Delta.Role != nil:
			if *ch.Delta.Role != "assistant" || st.text[ch.Index] != "" {
				t.Fatalf("bad or late role chunk: %s", d)
			}
			st.roles++
		case chat && ch.Delta != nil && ch.Delta.Content != nil:
			st.text[ch.Index] += *ch.Delta.Content
		case !chat && ch.Text != nil:
			st.text[ch.Index] += *ch.Text
		default:
			t.Fatalf("chunk with neither delta nor text: %s", d)
		}
		if ch.FinishReason != nil {
			st.finish[ch.Index] = *ch.FinishReason
		}
	}
	return st
}

func tokenCount(t testing.TB, base, text string) int {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"prompt": text, "add_special_tokens": false})
	code, body := post(t, base+"/tokenize", string(b))
	if code != 200 {
		t.Fatalf("tokenize: %d %s", code, body)
	}
	var r struct{ Count int }
	unmarshal(t, body, &r)
	return r.Count
}

func TestCompletionsNonStreaming(t *testing.T) {
	_, base := startServer(t, Config{})
	for _, tc := range []struct {
		path, body string
		chat       bool
	}{
		{"/v1/completions", `{"model":"llama-3-8b","prompt":"Once upon a time","max_tokens":20}`, false},
		{"/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"Hello there"}],"max_completion_tokens":20}`, true},
		{"/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"Hi"}],"max_tokens":7,"n":3}`, true},
	} {
		code, body := post(t, base+tc.path, tc.body)
		if code != 200 {
			t.Fatalf("%s: %d %s", tc.path, code, body)
		}
		var r fullJSON
		unmarshal(t, body, &r)
		wantObj := "text_completion"
		if tc.chat {
			wantObj = "chat.completion"
		}
		if r.Object != wantObj || r.Model != "llama-3-8b" || r.ID == "" || len(r.Choices) == 0 {
			t.Fatalf("bad response: %s", body)
		}
		total := 0
		for i, c := range r.Choices {
			text := ""
			if tc.chat {
				if c.Message == nil || c.Message.Role != "assistant" {
					t.Fatalf("choice without an assistant message: %s", body)
				}
				text = c.Message.Content
			} else {
				text = *c.Text
			}
			if c.Index != i || c.FinishReason != "length" {
				t.Errorf("choice %d: index %d finish %q; want length (OutputLen unset)", i, c.Index, c.FinishReason)
			}
			total += tokenCount(t, base, text)
		}
		if r.Usage.CompletionTokens != total || r.Usage.TotalTokens != r.Usage.PromptTokens+total || r.Usage.PromptTokens < 2 {
			t.Errorf("usage %+v, but the text is %d tokens", r.Usage, total)
		}
	}
}

func TestStreamingShape(t *testing.T) {
	_, base := startServer(t, Config{TimeScale: 0.001})
	for _, chat := range []bool{true, false} {
		path, body := "/v1/completions", `{"model":"llama-3-8b","prompt":"abc","max_tokens":12,"n":2,"stream":true,"stream_options":{"include_usage":true}}`
		if chat {
			path, body = "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"abc"}],"max_tokens":12,"n":2,"stream":true,"stream_options":{}}`
		}
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("%s: %d %q", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		st := readStream(t, b, chat)
		if !st.done || st.usage == nil || len(st.text) != 2 {
			t.Fatalf("%s: done %t usage %v choices %d", path, st.done, st.usage, len(st.text))
		}
		if chat && st.roles != 2 {
			t.Errorf("%s: %d role chunks, want one per choice", path, st.roles)
		}
		for i := range 2 {
			if st.finish[i] != "length" || tokenCount(t, base, st.text[i]) != 12 {
				t.Errorf("%s: choice %d finished %q with %q", path, i, st.finish[i], st.text[i])
			}
		}
		if st.usage.CompletionTokens != 24 || st.usage.TotalTokens != st.usage.PromptTokens+24 {
			t.Errorf("%s: usage %+v", path, *st.usage)
		}
		if want := 1 + 24 + 1 + map[bool]int{true: 2}[chat]; st.events != want {
			t.Errorf("%s: %d events, want %d", path, st.events, want)
		}
	}
	// Without stream_options there is no usage chunk.
	_, b := post(t, base+"/v1/completions", `{"model":"llama-3-8b","prompt":"abc","max_tokens":3,"stream":true}`)
	if st := readStream(t, b, false); st.usage != nil || !st.done {
		t.Errorf("usage without include_usage, or no [DONE]")
	}
}

func completionText(t testing.TB, base, body string) (string, string) {
	t.Helper()
	code, b := post(t, base+"/v1/completions", body)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	var r fullJSON
	unmarshal(t, b, &r)
	return *r.Choices[0].Text, r.Choices[0].FinishReason
}

// A request whose body carries a rule's text draws its length from that
// rule's distribution, the first that matches; the others from OutputLen.
func TestOutputLenWhen(t *testing.T) {
	_, url := startServer(t, Config{Seed: 7, TimeScale: 0.001, OutputLen: "fixed:3",
		OutputLenWhen: []string{"ESSAY=fixed:30", "ESS=fixed:20", "POEM=fixed:9"}})
	for _, tc := range []struct {
		prompt string
		want   int
	}{
		{"a question", 3},
		{"write an ESSAY", 30},
		{"an ESSAY and a POEM", 30},
		{"a POEM", 9},
	} {
		text, finish := completionText(t, url, fmt.Sprintf(`{"model":"llama-3-8b","prompt":%q,"max_tokens":40}`, tc.prompt))
		if n := tokenCount(t, url, text); n != tc.want || finish != "stop" {
			t.Errorf("%q: %d tokens (%s), want %d", tc.prompt, n, finish, tc.want)
		}
	}
}

func TestDeterminism(t *testing.T) {
	c := Config{Seed: 7, OutputLen: "uniform:1-40", TimeScale: 0.001}
	_, a := startServer(t, c)
	_, b := startServer(t, c)
	c.Seed = 8
	_, other := startServer(t, c)
	req := func(p string, stream bool) string {
		return fmt.Sprintf(`{"model":"llama-3-8b","prompt":%q,"max_tokens":40,"stream":%t}`, p, stream)
	}
	// Load one server with other traffic first: the output must not depend on it.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { completionText(t, a, req(fmt.Sprint("noise ", i), false)) })
	}
	wg.Wait()
	lengths := map[int]bool{}
	differ := 0
	for i := range 12 {
		p := fmt.Sprint("prompt number ", i)
		ta, fa := completionText(t, a, req(p, false))
		tb, fb := completionText(t, b, req(p, false))
		if ta != tb || fa != fb {
			t.Fatalf("same seed, same request, different output:\n%q %s\n%q %s", ta, fa, tb, fb)
		}
		_, sb := post(t, a+"/v1/completions", req(p, true))
		if st := readStream(t, sb, false); st.text[0] != ta || st.finish[0] != fa {
			t.Fatalf("streamed %q (%s) but not streamed %q (%s)", st.text[0], st.finish[0], ta, fa)
		}
		if to, _ := completionText(t, other, req(p, false)); to != ta {
			differ++
		}
		n := tokenCount(t, a, ta)
		if (n == 40) != (fa == "length") {
			t.Errorf("%d tokens but finish_reason %s", n, fa)
		}
		lengths[n] = true
	}
	if differ < 10 {
		t.Errorf("only %d of 12 outputs changed with the seed", differ)
	}
	if len(lengths) < 4 {
		t.Errorf("uniform:1-40 gave only %d distinct lengths in 12 requests", len(lengths))
	}
}

// checkErrorBody asserts vLLM's error shape and returns the message.
func checkErrorBody(t testing.TB, code int, body []byte, wantCode int, wantType string) string {
	t.Helper()
	var e struct {
		Error *struct {
			Message *string `json:"message"`
			Type    *string `json:"type"`
			Param   any     `json:"param"`
			Code    *int    `json:"code"`
		} `json:"error"`
	}
	unmarshal(t, body, &e)
	if code != wantCode || e.Error == nil || e.Error.Message == nil || e.Error.Type == nil || e.Error.Code == nil {
		t.Fatalf("status %d body %s; want %d with {error:{message,type,param,code}}", code, body, wantCode)
	}
	if *e.Error.Code != wantCode || *e.Error.Type != wantType {
		t.Fatalf("error %s; want code %d type %s", body, wantCode, wantType)
	}
	if !bytes.Contains(body, []byte(`"param":`)) {
		t.Fatalf("error without param: %s", body)
	}
	return *e.Error.Message
}

func TestBadInput(t *testing.T) {
	c := poolConfig(64)
	c.MaxModelLen = 64
	c.TimeScale = 0.001
	s, base := startServer(t, c)
	long := strings.Repeat("ab ", 80) // BOS, "ab", 79 × " ab", " "
	tests := []struct {
		name, path, body string
		code             int
		typ, want        string
	}{
		{"malformed json", "/v1/completions", `{"model":"llama-3-8b","prompt":`, 400, "BadRequestError", "JSON decode error"},
		{"not an object", "/v1/chat/completions", `[1,2]`, 400, "BadRequestError", "dictionary"},
		{"missing model", "/v1/completions", `{"prompt":"hi","max_tokens":4}`, 404, "NotFoundError", "The model `` does not exist."},
		{"wrong model", "/v1/chat/completions", `{"model":"gpt-4","messages":[{"role":"user","content":"hi"}]}`, 404, "NotFoundError", "The model `gpt-4` does not exist."},
		{"model not a string", "/v1/completions", `{"model":5,"prompt":"hi"}`, 400, "BadRequestError", "model"},
		{"max_tokens 0", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":0}`, 400, "BadRequestError", "max_tokens must be at least 1, got 0."},
		{"max_tokens negative", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":-3}`, 400, "BadRequestError", "max_tokens must be at least 1, got -3."},
		{"max_completion_tokens 0", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0}`, 400, "BadRequestError", "at least 1"},
		{"max_tokens fractional", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":2.5}`, 400, "BadRequestError", "valid integer"},
		{"prompt over max_model_len", "/v1/completions", `{"model":"llama-3-8b","prompt":"` + long + `","max_tokens":1}`, 400, "BadRequestError",
			"This model's maximum context length is 64 tokens. However, your request has 82 input tokens."},
		{"prompt+max_tokens over max_model_len", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi there","max_tokens":62}`, 400, "BadRequestError",
			"'max_tokens' or 'max_completion_tokens' is too large: 62. This model's maximum context length is 64 tokens and your request has 4 input tokens (62 > 64 - 4)."},
		{"n 0", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","n":0}`, 400, "BadRequestError", "n must be at least 1"},
		{"stream_options without stream", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","stream_options":{"include_usage":true}}`, 400, "BadRequestError", "stream=True"},
		{"missing messages", "/v1/chat/completions", `{"model":"llama-3-8b"}`, 400, "BadRequestError", "messages: Field required"},
		{"empty messages", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[]}`, 400, "BadRequestError", "at least 1"},
		{"message without role", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"content":"x"}]}`, 400, "BadRequestError", "role"},
		{"image content", "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "BadRequestError", "not supported"},
		{"missing prompt", "/v1/completions", `{"model":"llama-3-8b"}`, 400, "BadRequestError", "prompt: Field required"},
		{"batched prompts", "/v1/completions", `{"model":"llama-3-8b","prompt":["a","b"]}`, 400, "BadRequestError", "batch"},
		{"bad token id", "/v1/completions", `{"model":"llama-3-8b","prompt":[1,-2]}`, 400, "BadRequestError", "token id"},
		{"stream not a bool", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","stream":"yes"}`, 400, "BadRequestError", "boolean"},
		{"n beyond max_num_seqs", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":2,"n":300}`, 400, "BadRequestError", "max_num_seqs"},
		{"n beyond the pool", "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":60,"n":20}`, 400, "BadRequestError", "could never complete"},
		{"tokenize wrong model", "/tokenize", `{"model":"x","prompt":"hi"}`, 404, "NotFoundError", "does not exist"},
		{"tokenize malformed", "/tokenize", `{"prompt":`, 400, "BadRequestError", "JSON decode error"},
		// A shadowed error once let /tokenize count invalid messages.
		{"tokenize message without role", "/tokenize", `{"model":"llama-3-8b","messages":[{"content":"x"}]}`, 400, "BadRequestError", "role"},
		{"tokenize messages not a list", "/tokenize", `{"model":"llama-3-8b","messages":"hi"}`, 400, "BadRequestError", "valid list"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, base+tc.path, tc.body)
			msg := checkErrorBody(t, code, body, tc.code, tc.typ)
			if !strings.Contains(msg, tc.want) {
				t.Errorf("message %q lacks %q", msg, tc.want)
			}
		})
	}
	if st := s.Stats(); st.PromptTokens != 0 || st.PeakUsedBlocks != 0 || st.Running+st.Waiting != 0 {
		t.Errorf("rejected requests left a trace: %+v", st)
	}
	// Paths and methods as FastAPI answers them.
	if code, body := get(t, base+"/v1/nothing"); code != 404 || !strings.Contains(string(body), "Not Found") {
		t.Errorf("unknown path: %d %s", code, body)
	}
	if code, _ := get(t, base+"/v1/completions"); code != 405 {
		t.Errorf("GET on a POST route: %d", code)
	}
}

func TestTokenize(t *testing.T) {
	_, base := startServer(t, Config{MaxModelLen: 4096})
	code, body := post(t, base+"/tokenize", `{"model":"llama-3-8b","prompt":"Hello, world! 12345","return_token_strs":true}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var r struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []int    `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}
	unmarshal(t, body, &r)
	want := []string{"<|begin_of_text|>", "Hell", "o", ",", " wor", "ld", "!", " ", "123", "45"}
	if r.Count != len(want) || len(r.Tokens) != r.Count || r.MaxModelLen != 4096 || strings.Join(r.TokenStrs, "|") != strings.Join(want, "|") {
		t.Fatalf("tokenize = %s; want pieces %q", body, want)
	}
	if r.Tokens[0] != tokBOS {
		t.Errorf("first token %d, want BOS %d", r.Tokens[0], tokBOS)
	}
	if _, b := post(t, base+"/tokenize", `{"prompt":"x"}`); !bytes.Contains(b, []byte(`"token_strs":null`)) {
		t.Errorf("token_strs not null when not asked for: %s", b)
	}
	// The count /tokenize gives for a chat is the prompt_tokens a chat request is charged.
	msgs := `[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"One"},{"type":"text","text":"two"}]}]`
	_, tb := post(t, base+"/tokenize", `{"messages":`+msgs+`}`)
	var tr struct{ Count int }
	unmarshal(t, tb, &tr)
	_, cb := post(t, base+"/v1/chat/completions", `{"model":"llama-3-8b","max_tokens":1,"messages":`+msgs+`}`)
	var cr fullJSON
	unmarshal(t, cb, &cr)
	if tr.Count == 0 || cr.Usage.PromptTokens != tr.Count {
		t.Errorf("chat prompt_tokens %d, /tokenize count %d", cr.Usage.PromptTokens, tr.Count)
	}
}

func TestModelsAndHealth(t *testing.T) {
	_, base := startServer(t, Config{Model: "my-model", MaxModelLen: 2048})
	code, body := get(t, base+"/v1/models")
	var r struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			OwnedBy     string `json:"owned_by"`
			MaxModelLen int    `json:"max_model_len"`
			Created     int64  `json:"created"`
		} `json:"data"`
	}
	unmarshal(t, body, &r)
	if code != 200 || r.Object != "list" || len(r.Data) != 1 || r.Data[0].ID != "my-model" || r.Data[0].Object != "model" ||
		r.Data[0].OwnedBy != "vllm" || r.Data[0].MaxModelLen != 2048 || r.Data[0].Created == 0 {
		t.Fatalf("/v1/models = %d %s", code, body)
	}
	if code, _ := get(t, base+"/health"); code != 200 {
		t.Fatalf("/health = %d", code)
	}
	if code, body := post(t, base+"/v1/completions", `{"model":"my-model","prompt":"x","max_tokens":2}`); code != 200 {
		t.Fatalf("served model name not accepted: %d %s", code, body)
	}
}

// watchStats polls s until done closes and returns the highest UsedBlocks
// seen.
func watchStats(s *Server, done <-chan struct{}) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		var hi int64
		for {
			if u := s.Stats().UsedBlocks; u > hi {
				hi = u
			}
			select {
			case <-done:
				out <- hi
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return out
}

func TestKVUsageRisesAndReturnsToZero(t *testing.T) {
	s, base := startServer(t, Config{TimeScale: 0.01})
	done := make(chan struct{})
	seen := watchStats(s, done)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			code, b := post(t, base+"/v1/completions", fmt.Sprintf(`{"model":"llama-3-8b","prompt":"request %d","max_tokens":100,"stream":%t}`, i, i%2 == 0))
			if code != 200 {
				t.Errorf("%d %s", code, b)
			}
		})
	}
	wg.Wait()
	close(done)
	hi := <-seen
	st := s.Stats()
	if hi == 0 || st.PeakUsedBlocks < hi {
		t.Fatalf("usage never rose (seen %d, peak %d)", hi, st.PeakUsedBlocks)
	}
	// 8 sequences of about 4+100 tokens: 7 blocks each at the end.
	if st.PeakUsedBlocks > 8*7 {
		t.Errorf("peak %d blocks, more than 8 requests can hold", st.PeakUsedBlocks)
	}
	if st.UsedBlocks != 0 || st.Running != 0 || st.Waiting != 0 {
		t.Fatalf("after every request finished: %+v", st)
	}
	if st.GenerationTokens != 800 {
		t.Errorf("generated %d tokens, want 800", st.GenerationTokens)
	}
}

// longRequests are n concurrent completions of 100 prompt tokens and 400
// output tokens: 32 blocks each at their largest.
func longBody(i int, stream bool) string {
	return fmt.Sprintf(`{"model":"llama-3-8b","prompt":[%s],"max_tokens":400,"stream":%t}`,
		strings.TrimSuffix(strings.Repeat(fmt.Sprint(i+1, ","), 100), ","), stream)
}

func TestOOMMode(t *testing.T) {
	c := poolConfig(64)
	c.MaxModelLen = 512
	c.OnOverflow = OverflowOOM
	c.OOMRestart = 20 * time.Second // 1 s of wall time at this scale
	c.TimeScale = 0.05

	t.Run("within the pool", func(t *testing.T) {
		s, base := startServer(t, c)
		var wg sync.WaitGroup
		for i := range 2 { // 2 × 32 blocks: exactly the pool
			wg.Go(func() {
				if code, b := post(t, base+"/v1/completions", longBody(i, false)); code != 200 {
					t.Errorf("%d %s", code, b)
				}
			})
		}
		wg.Wait()
		if st := s.Stats(); st.OOMEvents != 0 || st.PeakUsedBlocks != 64 || !st.Healthy {
			t.Fatalf("%+v; want no OOM event and a full pool", st)
		}
	})

	t.Run("over the pool", func(t *testing.T) {
		s, base := startServer(t, c)
		// A stream under way when the pool runs out gets an error event.
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(longBody(9, true)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("stream: %d", resp.StatusCode)
		}
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: {") {
			t.Fatalf("first event %q %v", line, err)
		}
		if line, err := br.ReadString('\n'); err != nil || line != "\n" {
			t.Fatalf("first event not ended by a blank line: %q %v", line, err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[int]int{}
		for i := range 3 {
			wg.Go(func() {
				code, b := post(t, base+"/v1/completions", longBody(i, false))
				mu.Lock()
				codes[code]++
				mu.Unlock()
				switch code {
				case 500:
					if msg := checkErrorBody(t, code, b, 500, "InternalServerError"); !strings.Contains(msg, "CUDA out of memory") {
						t.Errorf("500 without CUDA out of memory: %s", msg)
					}
				case 503: // arrived after the OOM, while restarting
					checkErrorBody(t, code, b, 503, "ServiceUnavailableError")
				default:
					t.Errorf("request over the pool: %d %s", code, b)
				}
			})
		}
		wg.Wait()
		rest, _ := io.ReadAll(br)
		st := readStream(t, rest, false)
		if !strings.Contains(st.errData, "CUDA out of memory") || !st.done {
			t.Fatalf("the stream under way did not end with an error event and [DONE]: %q", rest)
		}
		if codes[500] == 0 {
			t.Errorf("no request got a 500: %v", codes)
		}
		stats := s.Stats()
		if stats.OOMEvents != 1 || stats.UsedBlocks != 0 || stats.Running != 0 {
			t.Fatalf("after the OOM: %+v", stats)
		}
		if code, _ := get(t, base+"/health"); code != 503 {
			t.Fatalf("/health = %d right after an OOM, want 503", code)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, _ := get(t, base+"/health")
			if code == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("never healthy again")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if code, b := post(t, base+"/v1/completions", `{"model":"llama-3-8b","prompt":"again","max_tokens":3}`); code != 200 {
			t.Fatalf("after the restart: %d %s", code, b)
		}
	})
}

func TestPreemptMode(t *testing.T) {
	c := poolConfig(64)
	c.MaxModelLen = 512
	c.TimeScale = 0.01
	s, base := startServer(t, c)
	var wg sync.WaitGroup
	for i := range 4 { // 4 × 32 blocks on a pool of 64
		wg.Go(func() {
			code, b := post(t, base+"/v1/completions", longBody(i, i%2 == 1))
			if code != 200 {
				t.Errorf("%d %s", code, b)
				return
			}
			var text string
			if i%2 == 1 {
				st := readStream(t, b, false)
				if !st.done || st.finish[0] != "length" {
					t.Errorf("stream %d did not complete: %+v", i, st)
				}
				text = st.text[0]
			} else {
				var r fullJSON
				unmarshal(t, b, &r)
				text = *r.Choices[0].Text
			}
			if n := tokenCount(t, base, text); n != 400 {
				t.Errorf("request %d got %d tokens, want 400", i, n)
			}
		})
	}
	wg.Wait()
	st := s.Stats()
	if st.Preemptions == 0 || st.OOMEvents != 0 {
		t.Fatalf("%+v; want preemptions and no OOM", st)
	}
	if st.PeakUsedBlocks > 64 || st.UsedBlocks != 0 || st.GenerationTokens != 1600 {
		t.Fatalf("%+v; want peak <= 64, nothing left, 1600 tokens", st)
	}
}

func TestShutdownFailsWhatOutlivesTheGrace(t *testing.T) {
	s, base, served := serveLoopback(t, DefaultConfig()) // real time: this stream would take 45 s
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"llama-3-8b","prompt":"x","max_tokens":3000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); err != context.DeadlineExceeded {
		t.Fatalf("Shutdown = %v, want the context's deadline", err)
	}
	body, _ := io.ReadAll(resp.Body)
	st := readStream(t, body, false)
	if !strings.Contains(st.errData, "shutting down") || !st.done {
		t.Fatalf("the stream cut by shutdown did not end with an error event and [DONE]: %q", body)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v after Shutdown", err)
	}
	if !idle(s) {
		t.Fatalf("left after shutdown: %+v", s.Stats())
	}
	if err := s.eng.submit(req(1, 1, 1)); err != errShutdown {
		t.Fatalf("submit after shutdown = %v", err)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown = %v", err)
	}
}
