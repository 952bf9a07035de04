package gateway

import (
	"testing"
)

func TestRewriteBody(t *testing.T) {
	tests := []struct {
		in        string
		usage     usageAsk
		maxTokens int
		want      string
		drop      bool
		model     string // the backend's name for a served_name
	}{
		{`{"model":"m","stream":true}`, askContinuous, 0, `{"stream_options":{"include_usage":true,"continuous_usage_stats":true},"model":"m","stream":true}`, false, ""},
		{` {"model":"m"}`, askContinuous, 0, ` {"stream_options":{"include_usage":true,"continuous_usage_stats":true},"model":"m"}`, false, ""},
		{`{"model":"m"}`, askAsSent, 16, `{"max_tokens":16,"model":"m"}`, false, ""},
		{`{"model":"m"}`, askContinuous, 16, `{"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_tokens":16,"model":"m"}`, false, ""},
		{`{"model":"m","stream_options":{"include_usage":false}}`, askContinuous, 0, `{"stream_options":{"include_usage":true,"continuous_usage_stats":true},"model":"m"}`, false, ""},
		{`{"model":"m","stream_options":{"continuous_usage_stats":false}}`, askContinuous, 0, `{"stream_options":{"include_usage":true,"continuous_usage_stats":true},"model":"m"}`, false, ""},
		{`{"model":"m","stream_options":null}`, askContinuous, 0, `{"stream_options":{"include_usage":true,"continuous_usage_stats":true},"model":"m"}`, false, ""},
		{`{"model":"m","max_tokens":null}`, askAsSent, 16, `{"max_tokens":16,"model":"m"}`, false, ""},
		{`{"model":"m","max_completion_tokens":null,"stream_options":null}`, askContinuous, 8, `{"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_tokens":8,"model":"m"}`, false, ""},
		// Keys as the backend reads them; every kept byte as the client wrote it.
		{`{"model":"m","max\u005ftokens":3}`, askAsSent, 16, `{"max_tokens":16,"model":"m"}`, false, ""},
		{`{"model":"m","\u0001\"":[1, 2],"max_tokens":2}`, askAsSent, 16, `{"max_tokens":16,"model":"m","\u0001\"":[1, 2]}`, false, ""},
		{` { "model" : "m\n" , "stream_options" : { "include_usage" : null , "x" : 1 } } `, askContinuous, 0, ` {"stream_options":{"include_usage":true,"continuous_usage_stats":true,"x" : 1},"model" : "m\n"}`, false, ""},
		{`{"max_tokens":1}`, askAsSent, 16, `{"max_tokens":16}`, false, ""},
		{`{"model":"m","stream\u005foptions":{"x":1}}`, askContinuous, 0, `{"stream_options":{"include_usage":true,"continuous_usage_stats":true,"x":1},"model":"m"}`, false, ""},
		{`{"max_completion_tokens":1}`, askAsSent, 0, `{}`, true, ""},
		{`{"model":"m","max_completion_tokens":3,"max_tokens":9}`, askAsSent, 0, `{"model":"m","max_tokens":9}`, true, ""},
		{`{"model":"m","max_tokens":9}`, askAsSent, 0, `{"model":"m","max_tokens":9}`, true, ""},
		{`{"model":"chat","max_tokens":9}`, askAsSent, 0, `{"model":"llama-3-8b","max_tokens":9}`, false, "llama-3-8b"},
		{`{"model":"m","stream_options":{"continuous_usage_stats":true,"x":1}}`, askFinal, 0, `{"stream_options":{"include_usage":true,"x":1},"model":"m"}`, false, ""},
		{`{"model":"m","stream":true}`, askFinal, 0, `{"stream_options":{"include_usage":true},"model":"m","stream":true}`, false, ""},
		{`{"m\u006fdel":"chat","stream":true}`, askContinuous, 4, `{"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_tokens":4,"model":"org/m \"x\"","stream":true}`, false, `org/m "x"`},
	}
	for _, tt := range tests {
		got, err := rewriteBody([]byte(tt.in), tt.usage, tt.maxTokens, tt.drop, tt.model)
		if err != nil || string(got) != tt.want {
			t.Errorf("rewriteBody(%s, %v, %d) = %s, %v; want %s", tt.in, tt.usage, tt.maxTokens, got, err, tt.want)
		}
	}
}
