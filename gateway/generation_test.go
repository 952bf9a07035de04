package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/backends/sim"
)

// A Responses or Messages body is read once, by the rules a chat's is:
// its prompt (instructions or system, then the messages) is one chat
// prompt, its length field the output's cap, and what the gateway cannot
// read as vLLM would is a 400 naming the field.
func TestParseGeneration(t *testing.T) {
	var p fastjson.Parser
	for _, tc := range []struct {
		name  string
		kind  endpoint
		body  string
		shape promptShape // zero: an error naming param
		max   int
		param string
	}{
		{"input string", responsesAPI, `{"model":"m","input":"abc"}`, promptShape{textBytes: 3, messages: 1}, 0, ""},
		{"instructions and items", responsesAPI, `{"model":"m","instructions":"be","input":[{"role":"user","content":"abc"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"de"}]},{"role":"user","content":[{"type":"input_text","text":"f"},{"type":"input_image","image_url":"x"}]}],"max_output_tokens":9,"stream":true}`,
			promptShape{textBytes: 8, messages: 4, images: 1}, 9, ""},
		{"a function call item", responsesAPI, `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":"ok"}]}`,
			promptShape{textBytes: len(`{"type":"function_call_output","call_id":"c","output":"ok"}`)}, 0, ""},
		{"background false", responsesAPI, `{"model":"m","input":"a","background":false}`, promptShape{textBytes: 1, messages: 1}, 0, ""},
		{"max_output_tokens 10.0", responsesAPI, `{"model":"m","input":"a","max_output_tokens":10.0}`, promptShape{textBytes: 1, messages: 1}, 10, ""},
		{"messages", messagesAPI, `{"model":"m","system":"be","messages":[{"role":"user","content":"abc"}],"max_tokens":5}`, promptShape{textBytes: 5, messages: 2}, 5, ""},
		{"system and content blocks", messagesAPI, `{"model":"m","system":[{"type":"text","text":"be"}],"messages":[{"role":"user","content":[{"type":"text","text":"abc"},{"type":"image","source":{}}]}],"max_tokens":5,"stream":false}`,
			promptShape{textBytes: 5, messages: 2, images: 1}, 5, ""},

		{"no model", responsesAPI, `{"input":"a"}`, promptShape{}, 0, "model"},
		{"no input", responsesAPI, `{"model":"m"}`, promptShape{}, 0, "input"},
		{"empty input", responsesAPI, `{"model":"m","input":[]}`, promptShape{}, 0, "input"},
		{"input of a number", responsesAPI, `{"model":"m","input":5}`, promptShape{}, 0, "input"},
		{"an item of a string", responsesAPI, `{"model":"m","input":["a"]}`, promptShape{}, 0, "input[0]"},
		{"a message without role", responsesAPI, `{"model":"m","input":[{"content":"a"}]}`, promptShape{}, 0, "input[0].role"},
		{"content of a number", responsesAPI, `{"model":"m","input":[{"role":"user","content":1}]}`, promptShape{}, 0, "input[0].content"},
		{"a text part without text", responsesAPI, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text"}]}]}`, promptShape{}, 0, "input[0].content[0].text"},
		{"instructions of a number", responsesAPI, `{"model":"m","input":"a","instructions":1}`, promptShape{}, 0, "instructions"},
		{"stream of a string", responsesAPI, `{"model":"m","input":"a","stream":"yes"}`, promptShape{}, 0, "stream"},
		{"max_output_tokens of a string", responsesAPI, `{"model":"m","input":"a","max_output_tokens":"5"}`, promptShape{}, 0, "max_output_tokens"},
		{"zero max_output_tokens", responsesAPI, `{"model":"m","input":"a","max_output_tokens":0}`, promptShape{}, 0, "max_output_tokens"},
		{"huge max_output_tokens", responsesAPI, `{"model":"m","input":"a","max_output_tokens":9223372036854775808}`, promptShape{}, 0, "max_output_tokens"},
		{"max_output_tokens 1e400", responsesAPI, `{"model":"m","input":"a","max_output_tokens":1e400}`, promptShape{}, 0, "max_output_tokens"},
		{"duplicate input", responsesAPI, `{"model":"m","input":"a","input":[{"role":"user","content":"bbbb"}]}`, promptShape{}, 0, "input"},
		{"duplicate max_output_tokens, escaped", responsesAPI, `{"model":"m","input":"a","max_output_tokens":1,"max_output_t\u006fkens":900}`, promptShape{}, 0, "max_output_tokens"},
		{"duplicate item content", responsesAPI, `{"model":"m","input":[{"role":"user","content":"a","content":"bbbb"}]}`, promptShape{}, 0, "input[0].content"},
		{"duplicate part text", responsesAPI, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a","text":"bb"}]}]}`, promptShape{}, 0, "input[0].content[0].text"},
		{"background", responsesAPI, `{"model":"m","input":"a","background":true}`, promptShape{}, 0, "background"},
		{"background of a string", responsesAPI, `{"model":"m","input":"a","background":"no"}`, promptShape{}, 0, "background"},
		{"previous_response_id of a number", responsesAPI, `{"model":"m","input":"a","previous_response_id":1}`, promptShape{}, 0, "previous_response_id"},

		{"no max_tokens", messagesAPI, `{"model":"m","messages":[{"role":"user","content":"a"}]}`, promptShape{}, 0, "max_tokens"},
		{"null max_tokens", messagesAPI, `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":null}`, promptShape{}, 0, "max_tokens"},
		{"huge max_tokens", messagesAPI, `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":99999999999999999999}`, promptShape{}, 0, "max_tokens"},
		{"fractional max_tokens", messagesAPI, `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":1.5}`, promptShape{}, 0, "max_tokens"},
		{"duplicate max_tokens", messagesAPI, `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":1,"max_tokens":900}`, promptShape{}, 0, "max_tokens"},
		{"duplicate system", messagesAPI, `{"model":"m","system":"a","system":"bbbbbb","messages":[{"role":"user","content":"a"}],"max_tokens":1}`, promptShape{}, 0, "system"},
		{"duplicate role", messagesAPI, `{"model":"m","messages":[{"role":"user","role":"assistant","content":"a"}],"max_tokens":1}`, promptShape{}, 0, "messages[0].role"},
		{"no messages", messagesAPI, `{"model":"m","max_tokens":1}`, promptShape{}, 0, "messages"},
		{"messages of an object", messagesAPI, `{"model":"m","messages":{},"max_tokens":1}`, promptShape{}, 0, "messages"},
		{"a message without content", messagesAPI, `{"model":"m","messages":[{"role":"user"}],"max_tokens":1}`, promptShape{}, 0, "messages[0].content"},
		{"a block without type", messagesAPI, `{"model":"m","messages":[{"role":"user","content":[{"text":"a"}]}],"max_tokens":1}`, promptShape{}, 0, "messages[0].content[0].type"},
		{"system of a number", messagesAPI, `{"model":"m","system":1,"messages":[{"role":"user","content":"a"}],"max_tokens":1}`, promptShape{}, 0, "system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseGeneration(&p, []byte(tc.body), tc.kind)
			if tc.param != "" {
				pe, ok := err.(*parseError)
				if !ok || pe.param != tc.param {
					t.Fatalf("%s: error %v; want a 400 naming %q", tc.body, err, tc.param)
				}
				return
			}
			if err != nil {
				t.Fatalf("%s: %v", tc.body, err)
			}
			if r.model != "m" || len(r.shapes) != 1 || withoutPieces(r.shapes)[0] != tc.shape || r.maxTokens != tc.max || r.n != 1 || r.seqs != 1 || r.resumable || !r.includeUsage {
				t.Fatalf("%s: %+v; want shape %+v, max %d", tc.body, r, tc.shape, tc.max)
			}
		})
	}
}

// A request that continues a stored conversation is reserved the whole
// context: the backend adds a prompt the gateway cannot see.
func TestPriorContextReservesTheContext(t *testing.T) {
	var p fastjson.Parser
	r, err := parseGeneration(&p, []byte(`{"model":"m","input":"a","previous_response_id":"resp_1","max_output_tokens":100}`), responsesAPI)
	if err != nil || !r.gen.prior {
		t.Fatalf("%+v %v", r, err)
	}
	x := &exchange{m: &model{name: "m", maxLen: 8192}, req: r}
	prompts, exact := []int{7}, []bool{true}
	x.priorContext(prompts, exact)
	if prompts[0] != 8092 || exact[0] {
		t.Errorf("prompt %d exact %v; want 8092, an estimate", prompts[0], exact[0])
	}
}

// The official client's responses.create reaches the backend's
// /v1/responses through the gateway, plain and streamed; the usage the
// backend reports is read, the prompt counted exactly, and the
// reservation given back.
func TestResponsesThroughGateway(t *testing.T) {
	_, url := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	client := openai.NewClient(option.WithBaseURL(gwURL+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	ctx := context.Background()
	tokens := func(kind, which string) float64 { return tokens(t, gw, kind, which) }
	params := responses.ResponseNewParams{
		Model:           "llama-3-8b",
		Instructions:    openai.String("Be brief."),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Say something.")},
		MaxOutputTokens: openai.Int(20),
	}
	full, err := client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if full.OutputText() == "" || full.Usage.OutputTokens == 0 || full.Model != "llama-3-8b" {
		t.Fatalf("response = %s", full.RawJSON())
	}
	if p, a := tokens("prompt", "predicted"), tokens("prompt", "actual"); p == 0 || p != a || a != float64(full.Usage.InputTokens) {
		t.Errorf("prompt tokens predicted %v, reported %v (%d in the answer); want the exact count read back", p, a, full.Usage.InputTokens)
	}
	if a := tokens("output", "actual"); a != float64(full.Usage.OutputTokens) {
		t.Errorf("output tokens read %v; the answer says %d", a, full.Usage.OutputTokens)
	}
	eventually(t, "the reservation to go back", func() bool { return held(gw) == 0 })

	stream := client.Responses.NewStreaming(ctx, params)
	deltas, last := 0, ""
	var usage responses.ResponseUsage
	for stream.Next() {
		ev := stream.Current()
		last = ev.Type
		if ev.Type == "response.output_text.delta" {
			deltas++
		}
		if ev.Type == "response.completed" || ev.Type == "response.incomplete" {
			usage = ev.Response.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if deltas == 0 || int64(deltas) != usage.OutputTokens || (last != "response.completed" && last != "response.incomplete") {
		t.Fatalf("stream: %d deltas, last %q, usage %+v", deltas, last, usage)
	}
	if a := tokens("output", "actual"); a != float64(full.Usage.OutputTokens+usage.OutputTokens) {
		t.Errorf("output tokens read %v; the answers say %d and %d", a, full.Usage.OutputTokens, usage.OutputTokens)
	}
	eventually(t, "the reservation to go back", func() bool { return held(gw) == 0 })
}

// A stream's events each count as a token of the reservation's progress:
// the reservation follows them, and finishes at the usage's count.
func TestTypedStreamsFollowTheirTokens(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.OutputLen = "fixed:40" })
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	for _, tc := range []struct{ path, body, delta, last string }{
		{"/v1/responses", `{"model":"llama-3-8b","input":"hi","max_output_tokens":100,"stream":true}`, "event: response.output_text.delta", "event: response.completed"},
		{"/v1/messages", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"stream":true}`, "event: content_block_delta", "event: message_stop"},
	} {
		before := tokens(t, gw, "output", "actual")
		r := postJSON(gwURL, tc.path, tc.body)
		if r.status != 200 || strings.Count(r.body, tc.delta) != 40 || !strings.HasSuffix(strings.TrimSpace(r.body[:strings.LastIndex(r.body, "event: ")+len(tc.last)]), tc.last) {
			t.Fatalf("%s: %d %s", tc.path, r.status, r.body)
		}
		if strings.Contains(r.body, "data: [DONE]") || strings.Contains(r.body, `"error"`) {
			t.Errorf("%s: chat's ending in a typed stream: %s", tc.path, r.body)
		}
		after := tokens(t, gw, "output", "actual")
		if after-before != 40 {
			t.Errorf("%s: usage read %v output tokens; want 40", tc.path, after-before)
		}
		eventually(t, tc.path+"'s reservation to go back", func() bool { return held(gw) == 0 })
	}
}

// The Messages API through the gateway: Anthropic's shapes, plain and
// streamed, and the gateway's own errors in Anthropic's shape, naming
// the field.
func TestMessagesThroughGateway(t *testing.T) {
	_, url := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	body := `{"model":"llama-3-8b","system":"Be brief.","messages":[{"role":"user","content":"hi"}],"max_tokens":12}`
	r := postJSON(gwURL, "/v1/messages", body)
	var msg struct {
		Type    string
		Content []struct{ Type, Text string }
		Usage   struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(r.body), &msg); err != nil || r.status != 200 || msg.Type != "message" || len(msg.Content) != 1 || msg.Usage.OutputTokens == 0 {
		t.Fatalf("%d %v %s", r.status, err, r.body)
	}
	if v := tokens(t, gw, "prompt", "actual"); v != float64(msg.Usage.InputTokens) {
		t.Errorf("prompt tokens read %v; the answer says %d", v, msg.Usage.InputTokens)
	}
	r = postJSON(gwURL, "/v1/messages/", strings.Replace(body, `"max_tokens"`, `"stream":true,"max_tokens"`, 1))
	if r.status != 200 || !strings.HasPrefix(r.body, "event: message_start\n") || !strings.HasSuffix(r.body, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
		t.Fatalf("stream: %d %s", r.status, r.body)
	}
	eventually(t, "the reservation to go back", func() bool { return held(gw) == 0 })

	for _, tc := range []struct {
		body   string
		status int
		typ    string
		field  string
	}{
		{`{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "max_tokens"},
		{`{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"max_tokens":2}`, 400, "invalid_request_error", "max_tokens"},
		{`{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":1e400}`, 400, "invalid_request_error", "max_tokens"},
		{`{"model":"llama-3-8b","messages":[{"role":"user","content":5}],"max_tokens":1}`, 400, "invalid_request_error", "messages[0].content"},
		{`{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":9000}`, 400, "invalid_request_error", "max_tokens"},
		{`{"model":"nope","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`, 404, "not_found_error", "nope"},
	} {
		r := postJSON(gwURL, "/v1/messages", tc.body)
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if err := json.Unmarshal([]byte(r.body), &e); err != nil || r.status != tc.status || e.Type != "error" || e.Error.Type != tc.typ || !strings.Contains(e.Error.Message, tc.field) {
			t.Errorf("%s: %d %s; want %d %s naming %s in Anthropic's shape", tc.body, r.status, r.body, tc.status, tc.typ, tc.field)
		}
	}
	if held(gw) != 0 {
		t.Errorf("%d bytes still held", held(gw))
	}
}

// A Responses body the gateway cannot read as vLLM would is a 400 in
// OpenAI's shape naming the field.
func TestResponsesBadBodies(t *testing.T) {
	_, url := startSim(t, nil)
	_, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	for _, tc := range []struct{ body, param string }{
		{`{"model":"llama-3-8b","input":"a","input":"b"}`, "input"},
		{`{"model":"llama-3-8b","input":"a","max_output_tokens":99999999999999999999}`, "max_output_tokens"},
		{`{"model":"llama-3-8b","input":"a","max_output_tokens":true}`, "max_output_tokens"},
		{`{"model":"llama-3-8b","input":"a","max_output_tokens":9000}`, "max_output_tokens"},
		{`{"model":"llama-3-8b","input":[{"role":"user","content":[{"type":"input_text","text":1}]}]}`, "input[0].content[0].text"},
		{`{"model":"llama-3-8b","input":"` + words(8200) + `"}`, "input"}, // counted exactly, past the context
	} {
		r := postJSON(gwURL, "/v1/responses", tc.body)
		if r.status != 400 || decodeError(t, r.body).Error.Param == nil || *decodeError(t, r.body).Error.Param != tc.param {
			t.Errorf("%s: %d %s; want a 400 naming %s", tc.body, r.status, r.body, tc.param)
		}
	}
	resp, err := httpClient.Get(gwURL + "/v1/responses")
	if err != nil || resp.StatusCode != 405 {
		t.Errorf("GET /v1/responses: %v %v; want 405", resp, err)
	}
	resp.Body.Close()
}

// A Responses request without max_output_tokens, for a model with
// default_max_tokens, is sent the default in max_output_tokens: the
// field the backend generates by, and the reservation assumed.
func TestResponsesDefaultMaxOutputIsSent(t *testing.T) {
	_, url := startSim(t, nil)
	cfg := strings.Replace(baseConfig(url, ""), "max_model_len: 8192", "max_model_len: 8192\n    default_max_tokens: 16", 1)
	gw, gwURL := startGateway(t, cfg, Options{})
	for _, body := range []string{`{"model":"llama-3-8b","input":"hi"}`, `{"max_output_tokens":null,"model":"llama-3-8b","input":"hi"}`} {
		r := postJSON(gwURL, "/v1/responses", body)
		if r.status != 200 || !strings.Contains(r.body, `"max_output_tokens":16,`) || !strings.Contains(r.body, `"output_tokens":16,`) {
			t.Fatalf("%s: %d %.400s", body, r.status, r.body)
		}
	}
	eventually(t, "the reservation to go back", func() bool { return held(gw) == 0 })
}

// The routes about what a backend keeps are passed through: a stored
// response, its cancellation, a token count. (The simulator keeps no
// response: its own 404 comes back, not the gateway's. It counts tokens
// as vLLM does: the prompt a /v1/messages request of the same messages
// reports as its input_tokens.)
func TestGenerationSubRoutesPassThrough(t *testing.T) {
	_, url := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	resp, err := httpClient.Get(gwURL + "/v1/responses/resp_123")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || b.String() != `{"detail":"Not Found"}` {
		t.Errorf("GET /v1/responses/{id}: %d %s; want the backend's answer", resp.StatusCode, b.String())
	}
	if r := postJSON(gwURL, "/v1/responses/resp_123/cancel", `{}`); r.status != 404 || r.body != `{"detail":"Not Found"}` {
		t.Errorf("cancel: %d %s; want the backend's answer", r.status, r.body)
	}
	const msgs = `"messages":[{"role":"user","content":"How many tokens is this?"}]`
	count := postJSON(gwURL, "/v1/messages/count_tokens", `{"model":"llama-3-8b","system":"Be brief.",`+msgs+`}`)
	var counted struct {
		InputTokens int `json:"input_tokens"`
	}
	if count.status != 200 || json.Unmarshal([]byte(count.body), &counted) != nil || counted.InputTokens <= 0 {
		t.Fatalf("count_tokens: %d %s", count.status, count.body)
	}
	gen := postJSON(gwURL, "/v1/messages", `{"model":"llama-3-8b","max_tokens":1,"system":"Be brief.",`+msgs+`}`)
	var used struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
	}
	if gen.status != 200 || json.Unmarshal([]byte(gen.body), &used) != nil || used.Usage.InputTokens != counted.InputTokens {
		t.Errorf("count_tokens said %d; the messages request used %d (%d %s)", counted.InputTokens, used.Usage.InputTokens, gen.status, gen.body)
	}
	// A bad body gets Anthropic's error shape from the simulator too.
	if r := postJSON(gwURL, "/v1/messages/count_tokens", `{"model":"llama-3-8b","messages":"hi"}`); r.status != 400 ||
		!strings.HasPrefix(r.body, `{"type":"error","error":{"type":"invalid_request_error"`) {
		t.Errorf("count_tokens with bad messages: %d %s", r.status, r.body)
	}
	if r := postJSON(gwURL, "/v1/messages/count_tokens", `{"model":"nope"}`); r.status != 404 || !strings.HasPrefix(r.body, `{"type":"error","error":{"type":"not_found_error"`) {
		t.Errorf("count_tokens for an unknown model: %d %s; want Anthropic's 404", r.status, r.body)
	}
	if held(gw) != 0 {
		t.Errorf("%d bytes held by a passthrough", held(gw))
	}
}

// A client that hangs up mid-stream cancels the backend's sequence, and
// the reservation goes back once, admission.abort_hold later on the
// gateway's clock.
func TestTypedStreamReleasedOnClientAbort(t *testing.T) {
	for _, tc := range []struct{ path, body, delta string }{
		{"/v1/responses", `{"model":"llama-3-8b","input":"hi","max_output_tokens":500,"stream":true}`, "event: response.output_text.delta"},
		{"/v1/messages", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":500,"stream":true}`, "event: content_block_delta"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			backend, url := startSim(t, func(c *sim.Config) { c.TimeScale, c.OutputLen = 1, "fixed:500" }) // ~8 s: far longer than the test
			clock := newClock()
			gw, gwURL := startGateway(t, baseConfig(url, ""), Options{Clock: clock})
			c, br := rawRequest(t, gwURL, tc.path, tc.body)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(line, tc.delta) {
					break
				}
			}
			if held(gw) == 0 || backend.Stats().Running != 1 {
				t.Fatalf("before hang-up: held %d, backend running %d", held(gw), backend.Stats().Running)
			}
			c.Close()
			advanceUntil(t, clock, 100*time.Millisecond, "the reservation to be released", func() bool { return held(gw) == 0 })
			eventually(t, "the backend to abort the sequence", func() bool { st := backend.Stats(); return st.Running == 0 && st.UsedBlocks == 0 })
			if v, _ := metricValue(t, gw, "kvgate_requests_total", map[string]string{"outcome": outcomeCanceled}); v != 1 {
				t.Errorf("%v requests canceled; want 1", v)
			}
		})
	}
}

// A backend that fails mid-stream (it shuts down) ends the stream with
// its error event, in the API's shape, which the gateway relays as the
// stream's end; one that fails before its first token gets an error
// answer. Either way the reservation goes back.
func TestTypedStreamReleasedOnBackendFailure(t *testing.T) {
	for _, tc := range []struct{ path, body, delta, errEvent string }{
		{"/v1/responses", `{"model":"llama-3-8b","input":"hi","max_output_tokens":500,"stream":true}`, "event: response.output_text.delta", `data: {"type":"error","code":"ServiceUnavailableError"`},
		{"/v1/messages", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":500,"stream":true}`, "event: content_block_delta", `data: {"type":"error","error":{"type":"overloaded_error"`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			backend, url := startSim(t, func(c *sim.Config) { c.TimeScale, c.OutputLen = 1, "fixed:500" })
			gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
			c, br := rawRequest(t, gwURL, tc.path, tc.body)
			defer c.Close()
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(line, tc.delta) {
					break
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // no grace: what runs fails at once
			backend.Shutdown(ctx)
			sawError := false
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					break
				}
				if strings.HasPrefix(line, tc.errEvent) {
					sawError = true
					if !json.Valid([]byte(strings.TrimPrefix(strings.TrimSpace(line), "data: "))) {
						t.Errorf("error event not JSON: %s", line)
					}
				}
				if line == "0\r\n" { // the chunked body's end
					break
				}
			}
			if !sawError {
				t.Error("no error event in the API's shape")
			}
			eventually(t, "the reservation to go back", func() bool { return held(gw) == 0 })
			if v, _ := metricValue(t, gw, "kvgate_requests_total", map[string]string{"outcome": outcomeFailed}); v != 1 {
				t.Errorf("%v requests failed; want 1", v)
			}
		})
	}
	t.Run("before the first token", func(t *testing.T) {
		backend, url := startSim(t, func(c *sim.Config) { c.TimeScale, c.StepBase = 1, time.Hour }) // the prefill never ends
		gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
		got := make(chan result, 1)
		go func() {
			got <- postJSON(gwURL, "/v1/messages", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`)
		}()
		eventually(t, "the backend to start", func() bool { return backend.Stats().Running == 1 })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		backend.Shutdown(ctx)
		r := <-got
		if (r.status != 502 && r.status != 503) || !strings.HasPrefix(r.body, `{"type":"error","error":{"type":`) {
			t.Errorf("%d %.300s; want the backend's failure in Anthropic's shape", r.status, r.body)
		}
		eventually(t, "the reservation to go back", func() bool { return held(gw) == 0 })
	})
}

// A typed stream the admission guard stops is cut, never resumed, and
// ends with its API's error event carrying the guard's reason; its
// reservation goes back.
func TestTypedStreamStoppedByTheGuard(t *testing.T) {
	for _, tc := range []struct{ path, body, delta, errEvent string }{
		{"/v1/responses", `{"model":"llama-3-8b","input":"hi","max_output_tokens":500,"stream":true}`, "event: response.output_text.delta", `data: {"type":"error","code":"` + reasonGuard + `"`},
		{"/v1/messages", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":500,"stream":true}`, "event: content_block_delta", `data: {"type":"error","error":{"type":"overloaded_error"`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			_, url := startSim(t, func(c *sim.Config) { c.TimeScale, c.OutputLen = 1, "fixed:500" })
			clock := newClock()
			gw, gwURL := startGateway(t, baseConfig(url, ""), Options{Clock: clock})
			c, br := rawRequest(t, gwURL, tc.path, tc.body)
			defer c.Close()
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(line, tc.delta) {
					break
				}
			}
			gw.flights.each(func(x *exchange) {
				if x.resume != nil {
					t.Error("a typed stream kept to be resumed")
				}
				x.StopForMemory()
			})
			sawError := false
			for !sawError {
				line, err := br.ReadString('\n')
				if err != nil {
					break
				}
				sawError = strings.HasPrefix(line, tc.errEvent)
			}
			if !sawError {
				t.Error("no error event of the guard in the API's shape")
			}
			advanceUntil(t, clock, 100*time.Millisecond, "the reservation to go back", func() bool { return held(gw) == 0 })
			if n := requestsTotal(gw, outcomeShed, reasonGuard); n != 1 {
				t.Errorf("requests shed by the guard: %g, want 1", n)
			}
		})
	}
}

// The error a typed stream is ended with by the gateway (a timeout, the
// guard, a broken backend) is in its API's shape; chat's keeps its own.
func TestStreamErrorShapes(t *testing.T) {
	e := &apiError{status: 503, typ: typeServer, code: reasonGuard, message: `stopped "here"`}
	for _, tc := range []struct {
		kind endpoint
		want string
	}{
		{chatCompletions, `data: {"error":{"message":"stopped \"here\"","type":"server_error","code":"` + reasonGuard + `"}}` + "\n\ndata: [DONE]\n\n"},
		{responsesAPI, `event: error` + "\n" + `data: {"type":"error","code":"` + reasonGuard + `","message":"stopped \"here\"","param":null,"sequence_number":8}` + "\n\n"},
		{messagesAPI, `event: error` + "\n" + `data: {"type":"error","error":{"type":"overloaded_error","message":"stopped \"here\""}}` + "\n\n"},
	} {
		var b bytes.Buffer
		w := bufio.NewWriter(&b)
		x := &exchange{req: &request{kind: tc.kind}}
		x.req.gen.seq = 7
		x.streamError(w, e)
		if b.String() != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.kind.path(), b.String(), tc.want)
		}
	}
}

func FuzzParseGeneration(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hello"}`,
		`{"model":"m","instructions":"be","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]}],"max_output_tokens":5,"stream":true}`,
		`{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}","call_id":"c"}],"previous_response_id":"r"}`,
		`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{}}]}],"max_tokens":3,"tools":[]}`,
		`{"model":"m","input":"a","input":"b"}`, `{"model":"m","messages":[],"max_tokens":1e400}`,
		`{"model":"m","input":[{"role":"user","content":"a","content":"b"}]}`, `{"model":"\u0000","input":"\ud800"}`, `[]`, `{`,
	} {
		for k := range generationPaths {
			f.Add([]byte(s), uint8(k))
		}
	}
	var p fastjson.Parser
	var pp fastjson.ParserPool
	f.Fuzz(func(t *testing.T, body []byte, k uint8) {
		kind := responsesAPI + endpoint(k%uint8(len(generationPaths)))
		r, err := parseGeneration(&p, body, kind)
		if err != nil {
			pe, ok := err.(*parseError)
			if !ok || err.Error() == "" {
				t.Fatalf("error of type %T: %v", err, err)
			}
			e := &apiError{status: 400, typ: typeInvalidRequest, param: pe.param, message: pe.msg}
			if out := e.appendJSON(nil, true); !json.Valid(out) {
				t.Fatalf("error body not JSON: %q from %q", out, body)
			}
			if out := appendAnthropicError(nil, 400, pe.msg); !json.Valid(out) {
				t.Fatalf("Anthropic error body not JSON: %q from %q", out, body)
			}
			return
		}
		if r.model == "" || r.kind != kind || len(r.shapes) != 1 || r.maxTokens < 0 || r.n != 1 || r.seqs != 1 || r.resumable ||
			(kind == messagesAPI && r.maxTokens == 0) {
			t.Fatalf("insane request %+v from %q", r, body)
		}
		if err := generationTexts(&pp, body, r); err != nil {
			t.Fatalf("generationTexts(%q): %v", body, err)
		}
		for _, pt := range r.prompts {
			if !json.Valid(pt.text) {
				t.Fatalf("the messages of %q are not JSON: %q", body, pt.text)
			}
			if tb := tokenizeBody(nil, r, 0); !json.Valid(tb) {
				t.Fatalf("the /tokenize body of %q is not JSON: %q", body, tb)
			}
		}
		if r.maxTokens == 0 {
			if b, err := withMaxOutput(body, 7); err != nil || !json.Valid(b) {
				t.Fatalf("withMaxOutput(%q) = %q, %v", body, b, err)
			}
		}
	})
}

// A served_name is rewritten to the backend's model name in the body
// forwarded and back in the answer and every event of a stream.
func TestGenerationServedName(t *testing.T) {
	_, url := startSim(t, nil)
	cfg := strings.Replace(baseConfig(url, ""), "  - name: llama-3-8b\n", "  - name: llama-3-8b\n    served_name: gen\n", 1)
	gw, gwURL := startGateway(t, cfg, Options{})
	for _, tc := range []struct{ path, body string }{
		{"/v1/responses", `{"model":"gen","input":"hi","max_output_tokens":5}`},
		{"/v1/responses", `{"model":"gen","input":"hi","max_output_tokens":5,"stream":true}`},
		{"/v1/messages", `{"model":"gen","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`},
		{"/v1/messages", `{"model":"gen","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`},
	} {
		r := postJSON(gwURL, tc.path, tc.body)
		if r.status != 200 || strings.Contains(r.body, "llama-3-8b") || !strings.Contains(r.body, `"model":"gen"`) {
			t.Errorf("%s %s: %d %.400s", tc.path, tc.body, r.status, r.body)
		}
	}
	eventually(t, "the reservations to go back", func() bool { return held(gw) == 0 })
}

// tokens is the model's count of prompt or output tokens, predicted or
// actual (read from the usage).
func tokens(t *testing.T, gw *Server, kind, which string) float64 {
	t.Helper()
	v, _ := metricValue(t, gw, "kvgate_tokens_"+which+"_total", map[string]string{"model": "llama-3-8b", "kind": kind})
	return v
}

// Every error on an Anthropic route reaches the client in Anthropic's
// shape, a backend's in FastAPI's shape or in plain text included.
func TestAnthropicRouteErrorsInAnthropicShape(t *testing.T) {
	f := startFake(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		if tokenize3(w, r) {
			return
		}
		b, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(b), "route"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(404)
			io.WriteString(w, `{"detail":"Not Found"}`)
		case strings.Contains(string(b), "validation"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(422)
			io.WriteString(w, `{"detail":[{"type":"missing","loc":["body","messages",0,"role"],"msg":"Field required"}]}`)
		default:
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(500)
			io.WriteString(w, "Internal Server Error")
		}
	})
	_, gwURL := startGateway(t, baseConfig(f.URL, ""), Options{DisableProbes: true})
	for _, tc := range []struct{ what, typ, msg string }{
		{"route", "not_found_error", "Not Found"},
		{"validation", "invalid_request_error", "body.messages.0.role: Field required"},
		{"text", "api_error", "Internal Server Error"},
	} {
		r := postJSON(gwURL, "/v1/messages/count_tokens", `{"model":"llama-3-8b","messages":[{"role":"user","content":"`+tc.what+`"}]}`)
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(r.body), &e); err != nil || e.Type != "error" || e.Error.Type != tc.typ || e.Error.Message != tc.msg {
			t.Errorf("%s: %d %s; want %s %q", tc.what, r.status, r.body, tc.typ, tc.msg)
		}
		if r.header.Get("X-Request-Id") == "" {
			t.Errorf("%s: no X-Request-Id", tc.what)
		}
	}
}
