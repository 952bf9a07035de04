package sim

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// A stream's events carry the tokens Config says: StreamInterval each (the
// last what is left), or a random 1 to StreamMerge; with
// continuous_usage_stats every chunk carries the choice's tokens so far,
// as vLLM's do, unless the server is told to ignore it. The text and the
// final usage are the same whatever the events.
func TestStreamEvents(t *testing.T) {
	const maxTokens = 40
	for _, tc := range []struct {
		name               string
		interval, merge    int
		noContinuous       bool
		continuous         bool
		minEvents, maxEvts int
	}{
		{"one token an event", 0, 0, false, true, 40, 40},
		{"stream interval 4", 4, 0, false, true, 10, 10},
		{"stream interval 16", 16, 0, false, false, 3, 3},
		{"random merges of up to 5", 0, 5, false, true, 8, 39},
		{"continuous usage ignored", 4, 0, true, true, 10, 10},
	} {
		for _, chat := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s chat=%v", tc.name, chat), func(t *testing.T) {
				_, base := startServer(t, Config{TimeScale: 0, Seed: 3, StreamInterval: tc.interval, StreamMerge: tc.merge, NoContinuousUsage: tc.noContinuous})
				path, prompt := "/v1/completions", `"prompt":"hello there"`
				if chat {
					path, prompt = "/v1/chat/completions", `"messages":[{"role":"user","content":"hello there"}]`
				}
				body := fmt.Sprintf(`{"model":"llama-3-8b",%s,"max_tokens":%d,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":%v}}`,
					prompt, maxTokens, tc.continuous)
				code, b := post(t, base+path, body)
				if code != 200 {
					t.Fatalf("%d %s", code, b)
				}
				type chunk struct {
					Choices []struct {
						Text  *string `json:"text"`
						Delta *struct {
							Content *string `json:"content"`
						} `json:"delta"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
					Usage *usageJSON `json:"usage"`
				}
				wantUsage := tc.continuous && !tc.noContinuous
				text, events, last, finals := "", 0, -1, 0
				for _, d := range sseData(t, b) {
					if d == "[DONE]" {
						continue
					}
					var c chunk
					if err := json.Unmarshal([]byte(d), &c); err != nil {
						t.Fatalf("%v: %s", err, d)
					}
					if len(c.Choices) == 0 {
						finals++
						if c.Usage == nil || c.Usage.CompletionTokens != maxTokens {
							t.Fatalf("final usage %s, want %d tokens", d, maxTokens)
						}
						continue
					}
					if (c.Usage != nil) != wantUsage {
						t.Fatalf("usage on a chunk: %v, want %v: %s", c.Usage != nil, wantUsage, d)
					}
					piece := ""
					if ch := c.Choices[0]; ch.Text != nil {
						piece = *ch.Text
					} else if ch.Delta.Content != nil {
						piece = *ch.Delta.Content
					}
					if piece != "" {
						events++
						text += piece
					}
					if c.Usage != nil {
						if c.Usage.CompletionTokens < last {
							t.Fatalf("usage went back from %d: %s", last, d)
						}
						last = c.Usage.CompletionTokens
						if n := tokenCount(t, base, text); n != last {
							t.Fatalf("a chunk says %d tokens so far, the text is %d", last, n)
						}
					}
				}
				if finals != 1 || events < tc.minEvents || events > tc.maxEvts {
					t.Fatalf("%d events of text (want %d to %d), %d final usages", events, tc.minEvents, tc.maxEvts, finals)
				}
				if n := tokenCount(t, base, text); n != maxTokens {
					t.Fatalf("the text is %d tokens, want %d", n, maxTokens)
				}
			})
		}
	}
}

// The Responses and Messages streams merge their deltas the same way.
func TestStreamEventsTyped(t *testing.T) {
	_, base := startServer(t, Config{TimeScale: 0, Seed: 3, StreamInterval: 8})
	for _, tc := range []struct{ path, body, delta string }{
		{"/v1/responses", `{"model":"llama-3-8b","input":"hi","max_output_tokens":40,"stream":true,"ignore_eos":true}`, "response.output_text.delta"},
		{"/v1/messages", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":40,"stream":true,"ignore_eos":true}`, "content_block_delta"},
	} {
		code, b := post(t, base+tc.path, tc.body)
		if code != 200 {
			t.Fatalf("%s: %d %s", tc.path, code, b)
		}
		if n := strings.Count(string(b), "event: "+tc.delta+"\n"); n != 5 {
			t.Errorf("%s: %d delta events, want 40 tokens in 5", tc.path, n)
		}
	}
}

func TestStreamEventsConfig(t *testing.T) {
	for _, c := range []Config{{StreamInterval: -1}, {StreamMerge: -1}, {StreamInterval: 2, StreamMerge: 3}} {
		if _, err := New(c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
