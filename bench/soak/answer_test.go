package main

import "testing"

func TestJudge(t *testing.T) {
	const (
		chatStream = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"
		respDone   = "event: response.created\ndata: {\"type\":\"response.created\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n"
		msgDone    = "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	)
	tests := []struct {
		name   string
		api    api
		stream bool
		status int
		body   string
		want   outcome
		reason string
	}{
		{"chat whole", apiChat, false, 200, `{"choices":[{"message":{"role":"assistant","content":"a"},"finish_reason":"length"}]}`, answered, ""},
		{"chat empty body", apiChat, false, 200, ``, broken, ""},
		{"chat without finish_reason", apiChat, false, 200, `{"choices":[{"message":{"content":"a"},"finish_reason":null}]}`, broken, ""},
		{"completions whole", apiCompletions, false, 200, `{"choices":[{"text":"a","finish_reason":"stop"}]}`, answered, ""},
		{"completions cut JSON", apiCompletions, false, 200, `{"choices":[{"text":"a","fin`, broken, ""},
		{"chat stream whole", apiChat, true, 200, chatStream, answered, ""},
		{"chat stream without [DONE]", apiChat, true, 200, "data: {\"choices\":[]}\n\n", broken, ""},
		{"chat stream cut mid-event", apiChat, true, 200, "data: {\"choices\":[]}\n\ndata: {\"cho", broken, ""},
		{"chat stream empty", apiChat, true, 200, "", broken, ""},
		{"chat stream ended by an error", apiChat, true, 200, "data: {\"error\":{\"message\":\"m\",\"type\":\"server_error\",\"code\":\"guard_stop\"}}\n\ndata: [DONE]\n\n", failedEnd, "200 stream error guard_stop"},
		{"responses whole", apiResponses, false, 200, `{"object":"response","status":"completed","output":[{"type":"message"}]}`, answered, ""},
		{"responses in progress is not whole", apiResponses, false, 200, `{"object":"response","status":"in_progress","output":[]}`, broken, ""},
		{"responses stream whole", apiResponses, true, 200, respDone, answered, ""},
		{"responses stream incomplete is an end", apiResponses, true, 200, "event: response.incomplete\ndata: {\"type\":\"response.incomplete\"}\n\n", answered, ""},
		{"responses stream without its end", apiResponses, true, 200, "event: response.created\ndata: {\"type\":\"response.created\"}\n\n", broken, ""},
		{"responses stream ended by an error", apiResponses, true, 200, "event: error\ndata: {\"type\":\"error\",\"code\":\"upstream_error\",\"message\":\"m\"}\n\n", failedEnd, "200 stream error upstream_error"},
		{"responses stream with [DONE] only", apiResponses, true, 200, "data: [DONE]\n\n", broken, ""},
		{"messages whole", apiMessages, false, 200, `{"type":"message","content":[{"type":"text","text":"a"}],"stop_reason":"max_tokens"}`, answered, ""},
		{"messages stream whole", apiMessages, true, 200, msgDone, answered, ""},
		{"messages stream without message_stop", apiMessages, true, 200, "event: message_start\ndata: {\"type\":\"message_start\"}\n\n", broken, ""},
		{"messages stream ended by an error", apiMessages, true, 200, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"m\"}}\n\n", failedEnd, "200 stream error overloaded_error"},
		{"embeddings whole", apiEmbeddings, false, 200, `{"data":[{"embedding":[0.1]}]}`, answered, ""},
		{"embeddings empty", apiEmbeddings, false, 200, `{"data":[]}`, broken, ""},
		{"rerank whole", apiRerank, false, 200, `{"results":[{"index":0,"relevance_score":0.5}]}`, answered, ""},
		{"OpenAI error with a code", apiChat, false, 429, `{"error":{"message":"m","type":"rate_limit_error","param":null,"code":"queue_timeout"}}`, refused, "429 queue_timeout"},
		{"OpenAI error without a code names its type", apiEmbeddings, false, 500, `{"error":{"message":"m","type":"server_error","code":null}}`, refused, "500 server_error"},
		{"Anthropic error", apiMessages, false, 429, `{"type":"error","error":{"type":"rate_limit_error","message":"m"}}`, refused, "429 rate_limit_error"},
		{"OpenAI shape on Messages is not its shape", apiMessages, false, 429, `{"error":{"message":"m","type":"rate_limit_error","code":"queue_timeout"}}`, unshaped, ""},
		{"plain text error", apiChat, false, 503, `Service Unavailable`, unshaped, ""},
		{"error without a message", apiChat, false, 502, `{"error":{"type":"server_error"}}`, unshaped, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := judge(tc.api, tc.stream, tc.status, []byte(tc.body))
			if v.outcome != tc.want {
				t.Fatalf("outcome %d, want %d (%s)", v.outcome, tc.want, v.reason)
			}
			if tc.reason != "" && v.reason != tc.reason {
				t.Errorf("reason %q, want %q", v.reason, tc.reason)
			}
		})
	}
}

func TestNeeds(t *testing.T) {
	for msg, want := range map[string]float64{
		"It needs 808.0 MiB of KV cache; retry after 1.2s.":      808 << 20,
		"This request needs 1.5 GiB of KV cache, more than your": 1.5 * (1 << 30),
	} {
		if got, ok := needs(msg); !ok || got != want {
			t.Errorf("needs(%q) = %g, %v; want %g", msg, got, ok, want)
		}
	}
	if _, ok := needs("no size here"); ok {
		t.Error("a message without a size read as one")
	}
}
