package sim

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// The official client reads the simulator's Responses API as it reads
// OpenAI's or vLLM's: whole and streamed, with usage.
func TestOpenAIClientResponses(t *testing.T) {
	_, base := startServer(t, Config{TimeScale: 0.001})
	client := newClient(base)
	ctx := context.Background()
	params := responses.ResponseNewParams{
		Model:           "llama-3-8b",
		Instructions:    openai.String("Be brief."),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Say something.")},
		MaxOutputTokens: openai.Int(25),
	}
	full, err := client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if full.OutputText() == "" || full.Status != "incomplete" || full.Usage.OutputTokens != 25 || full.Usage.InputTokens == 0 || full.Model != "llama-3-8b" {
		t.Fatalf("response = %s", full.RawJSON())
	}

	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
		responses.ResponseInputItemParamOfMessage("Say something.", responses.EasyInputMessageRoleUser),
	}}
	stream := client.Responses.NewStreaming(ctx, params)
	var text strings.Builder
	deltas, last := 0, ""
	var usage responses.ResponseUsage
	for stream.Next() {
		ev := stream.Current()
		last = ev.Type
		switch ev.Type {
		case "response.output_text.delta":
			deltas++
			text.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			usage = ev.Response.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if deltas != 25 || usage.OutputTokens != 25 || usage.InputTokens != full.Usage.InputTokens || last != "response.incomplete" || text.String() != full.OutputText() {
		t.Fatalf("stream: %d deltas, last %q, usage %+v, text %q vs %q", deltas, last, usage, text.String(), full.OutputText())
	}
}

// /v1/messages answers in Anthropic's shapes: a message, a stream of its
// typed events, and errors as {"type":"error","error":{...}}.
func TestMessagesAPI(t *testing.T) {
	_, base := startServer(t, Config{TimeScale: 0.001})
	body := `{"model":"llama-3-8b","system":"Be brief.","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":7`
	st, b := post(t, base+"/v1/messages", body+"}")
	var msg struct {
		Type       string `json:"type"`
		StopReason string `json:"stop_reason"`
		Content    []struct{ Type, Text string }
		Usage      struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	}
	if err := json.Unmarshal(b, &msg); st != 200 || err != nil || msg.Type != "message" || msg.StopReason != "max_tokens" ||
		len(msg.Content) != 1 || msg.Content[0].Text == "" || msg.Usage.OutputTokens != 7 || msg.Usage.InputTokens == 0 {
		t.Fatalf("%d %v %s", st, err, b)
	}
	st, b = post(t, base+"/v1/messages", body+`,"stream":true}`)
	events := []string{}
	for _, line := range strings.Split(string(b), "\n") {
		if ev, ok := strings.CutPrefix(line, "event: "); ok {
			events = append(events, ev)
		}
	}
	want := "message_start content_block_start" + strings.Repeat(" content_block_delta", 7) + " content_block_stop message_delta message_stop"
	if st != 200 || strings.Join(events, " ") != want || !strings.Contains(string(b), `"usage":{"input_tokens":`+itoa(msg.Usage.InputTokens)+`,"output_tokens":7}`) {
		t.Fatalf("%d events %v\n%s", st, events, b)
	}
	for _, tc := range []struct{ body, param string }{
		{`{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}]}`, "max_tokens"},
		{`{"model":"nope","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`, ""},
	} {
		st, b := post(t, base+"/v1/messages", tc.body)
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if err := json.Unmarshal(b, &e); err != nil || st/100 != 4 || e.Type != "error" || e.Error.Type == "" || !strings.Contains(e.Error.Message, tc.param) {
			t.Errorf("%s: %d %s", tc.body, st, b)
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
