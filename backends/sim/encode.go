package sim

import (
	"encoding/json"
	"strconv"
)

// encoder writes one request's responses in vLLM's shapes. head is the part
// every chunk of the request shares, up to and including `"choices":[`, so
// that a token costs a handful of appends and no allocation.
type encoder struct {
	chat bool
	head []byte // `{"id":"…","object":"…","created":…,"model":"…","choices":[`
}

func newEncoder(chat, stream bool, id string, created int64, modelJSON []byte) encoder {
	obj := "text_completion"
	switch {
	case chat && stream:
		obj = "chat.completion.chunk"
	case chat:
		obj = "chat.completion"
	}
	h := make([]byte, 0, 96+len(modelJSON))
	h = append(h, `{"id":"`...)
	h = append(h, id...)
	h = append(h, `","object":"`...)
	h = append(h, obj...)
	h = append(h, `","created":`...)
	h = strconv.AppendInt(h, created, 10)
	h = append(h, `,"model":`...)
	h = append(h, modelJSON...)
	h = append(h, `,"choices":[`...)
	return encoder{chat: chat, head: h}
}

func finishReason(gen, maxTokens int) string {
	if gen >= maxTokens {
		return "length"
	}
	return "stop"
}

// role is the first chunk of choice i of a chat stream; with continuous
// usage (usage), vLLM puts the prompt's on it.
func (e *encoder) role(dst []byte, i int, prompt int, usage bool) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, e.head...)
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
	if usage {
		dst = appendUsage(append(dst, ','), prompt, 0)
	}
	return append(dst, "}\n\n"...)
}

// token is the chunk of tokens [from, to) of choice i, sequence key k;
// finish is "" until the last. usage, when >= 0, is the choice's tokens
// so far, put on the chunk as vLLM's continuous_usage_stats does (prompt
// prompt tokens).
func (e *encoder) token(dst []byte, i int, k uint64, from, to int, finish string, prompt, usage int) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, e.head...)
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	if e.chat {
		dst = append(dst, `,"delta":{"content":"`...)
		dst = appendText(dst, k, from, to)
		dst = append(dst, `"},"logprobs":null,"finish_reason":`...)
	} else {
		dst = append(dst, `,"text":"`...)
		dst = appendText(dst, k, from, to)
		dst = append(dst, `","logprobs":null,"finish_reason":`...)
	}
	if finish == "" {
		dst = append(dst, `null`...)
	} else {
		dst = append(dst, '"')
		dst = append(dst, finish...)
		dst = append(dst, '"')
	}
	dst = append(dst, `,"stop_reason":null}]`...)
	if usage >= 0 {
		dst = appendUsage(append(dst, ','), prompt, usage)
	}
	return append(dst, "}\n\n"...)
}

func appendUsage(dst []byte, promptTokens, completionTokens int) []byte {
	dst = append(dst, `"usage":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(promptTokens), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(promptTokens+completionTokens), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(completionTokens), 10)
	return append(dst, `,"prompt_tokens_details":null}`...)
}

// usage is the last chunk of a stream with include_usage: no choices.
func (e *encoder) usage(dst []byte, promptTokens, completionTokens int) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, e.head...)
	dst = append(dst, `],`...)
	dst = appendUsage(dst, promptTokens, completionTokens)
	return append(dst, "}\n\n"...)
}

func appendDone(dst []byte) []byte { return append(dst, "data: [DONE]\n\n"...) }

// appendErrorEvent is how vLLM ends a stream that failed: the error body as
// one event, then [DONE].
func appendErrorEvent(dst []byte, e *apiError) []byte {
	dst = append(dst, "data: "...)
	dst = e.appendJSON(dst)
	dst = append(dst, "\n\n"...)
	return appendDone(dst)
}

// full is a whole non-streamed response for the sequences of r.
func (e *encoder) full(dst []byte, r *request) []byte {
	dst = append(dst, e.head...)
	completion := 0
	for i := range r.seqs {
		sq := &r.seqs[i]
		gen := int(sq.pub.Load())
		completion += gen
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		if e.chat {
			dst = append(dst, `,"message":{"role":"assistant","content":"`...)
			dst = appendText(dst, sq.key, 0, gen)
			dst = append(dst, `","tool_calls":[]},"logprobs":null,"finish_reason":"`...)
		} else {
			dst = append(dst, `,"text":"`...)
			dst = appendText(dst, sq.key, 0, gen)
			dst = append(dst, `","logprobs":null,"finish_reason":"`...)
		}
		dst = append(dst, finishReason(gen, r.maxTokens)...)
		dst = append(dst, `","stop_reason":null}`...)
	}
	dst = append(dst, `],`...)
	dst = appendUsage(dst, r.prompt, completion)
	return append(dst, `}`...)
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return b
}
