package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/kvgate/kvgate/internal/jsonscan"
)

// usageAsk is the usage a stream's body asks the backend for.
type usageAsk uint8

const (
	askAsSent     usageAsk = iota // the client's stream_options, untouched
	askFinal                      // include_usage: the count at the end
	askContinuous                 // and continuous_usage_stats: on every chunk too
)

// rewriteBody returns body with what the gateway must add or remove: with
// usage, stream_options.include_usage, and continuous_usage_stats where
// the backend takes it (so it learns the real token counts of a stream:
// at its end, and on every chunk as it goes, where vLLM and servers like
// it report them); with maxTokens > 0, max_tokens (the model's
// default_max_tokens, which the reservation assumed); with dropMaxCompletion,
// no max_completion_tokens (a /v1/completions body, whose reservation
// followed max_tokens). Members are added after the opening brace and
// removed by their bytes; every other byte stays as the client sent it (a
// re-serialised body would re-quote keys, and fastjson's quoting is not
// always JSON's). body is one parseRequest accepted: it is read by a scan,
// not parsed again.
func rewriteBody(body []byte, ask usageAsk, maxTokens int, dropMaxCompletion bool, model string) ([]byte, error) {
	usage := ask != askAsSent
	drop := func(name []byte) bool {
		return (usage && keyIs(name, "stream_options")) || (model != "" && keyIs(name, "model")) ||
			(maxTokens > 0 && keyIs(name, "max_tokens")) ||
			((maxTokens > 0 || dropMaxCompletion) && keyIs(name, "max_completion_tokens"))
	}
	// One pass over the members: the spans kept, and the stream options
	// (an object or null: parseRequest refused anything else).
	var keptBuf [16][2]int // a request has a few members: no allocation for their spans
	kept := keptBuf[:0]
	var so []byte
	if err := jsonscan.Members(body, func(name []byte, start, value, end int) bool {
		if !drop(name) {
			kept = append(kept, [2]int{start, end})
		} else if usage && so == nil && keyIs(name, "stream_options") {
			so = body[value:end]
		}
		return true
	}); err != nil {
		return nil, err
	}
	var addBuf [128]byte // the members added, before they are copied into out
	add := addBuf[:0]
	if usage {
		var err error
		if add, err = appendStreamOptions(add, ask, so); err != nil {
			return nil, err
		}
	}
	if maxTokens > 0 {
		add = append(strconv.AppendInt(append(add, `"max_tokens":`...), int64(maxTokens), 10), ',')
	}
	if model != "" {
		add = append(jsonscan.AppendString(append(add, `"model":`...), model), ',')
	}
	open := bytes.IndexByte(body, '{')
	out := append(append(make([]byte, 0, len(body)+len(add)), body[:open+1]...), add...)
	for k, m := range kept {
		if k > 0 {
			out = append(out, ',')
		}
		out = append(out, body[m[0]:m[1]]...)
	}
	if len(kept) == 0 && len(add) > 0 {
		out = out[:len(out)-1] // the added members' trailing comma
	}
	return append(out, '}'), nil
}

// appendStreamOptions appends the stream options that ask for the usage
// as ask says, the client's others (so, its own object or null) kept.
func appendStreamOptions(add []byte, ask usageAsk, so []byte) ([]byte, error) {
	add = append(add, `"stream_options":{"include_usage":true`...)
	if ask == askContinuous {
		add = append(add, `,"continuous_usage_stats":true`...)
	}
	if len(so) > 0 && so[0] == '{' {
		// Keep the client's other stream options.
		if err := jsonscan.Members(so, func(name []byte, start, _, end int) bool {
			if !keyIs(name, "include_usage") && !keyIs(name, "continuous_usage_stats") {
				add = append(append(add, ','), so[start:end]...)
			}
			return true
		}); err != nil {
			return nil, fmt.Errorf("stream_options: %w", err)
		}
	}
	return append(add, "},"...), nil
}

// keyIs reports whether a key, as written between its quotes, names want:
// a key spelled with escapes (max\u005ftokens) is the same key to the
// backend's parser.
func keyIs(raw []byte, want string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == want
	}
	var k string
	return json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &k) == nil && k == want
}
