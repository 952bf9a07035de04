package sim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

// The official client reads the simulator as it reads OpenAI or vLLM.

func newClient(base string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("sim"), option.WithMaxRetries(0))
}

func TestOpenAIClientChat(t *testing.T) {
	_, base := startServer(t, Config{TimeScale: 0.001})
	client := newClient(base)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:     "llama-3-8b",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Say something.")},
		MaxTokens: openai.Int(25),
	}
	full, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(full.Choices) != 1 || full.Choices[0].Message.Content == "" || full.Choices[0].FinishReason != "length" ||
		full.Usage.CompletionTokens != 25 || full.Model != "llama-3-8b" {
		t.Fatalf("chat completion = %s", full.RawJSON())
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("the accumulator refused chunk %s", stream.Current().RawJSON())
		}
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != full.Choices[0].Message.Content ||
		acc.Choices[0].FinishReason != "length" || acc.Usage.CompletionTokens != 25 || acc.Usage.PromptTokens != full.Usage.PromptTokens {
		t.Fatalf("streamed %q (%s, %+v), not streamed %q", acc.Choices[0].Message.Content, acc.Choices[0].FinishReason, acc.Usage, full.Choices[0].Message.Content)
	}
	if chunks != 1+25+1 {
		t.Errorf("%d chunks, want role + 25 tokens + usage", chunks)
	}
}

func TestOpenAIClientCompletions(t *testing.T) {
	_, base := startServer(t, Config{TimeScale: 0.001})
	client := newClient(base)
	ctx := context.Background()
	params := openai.CompletionNewParams{
		Model:     "llama-3-8b",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("The quick brown fox")},
		MaxTokens: openai.Int(16),
		N:         openai.Int(2),
	}
	full, err := client.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(full.Choices) != 2 || full.Usage.CompletionTokens != 32 || full.Choices[1].Index != 1 {
		t.Fatalf("completion = %s", full.RawJSON())
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Completions.NewStreaming(ctx, params)
	text := map[int64]string{}
	var usage int64
	for stream.Next() {
		c := stream.Current()
		for _, ch := range c.Choices {
			text[ch.Index] += ch.Text
		}
		if c.Usage.TotalTokens > 0 {
			usage = c.Usage.CompletionTokens
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	for i, ch := range full.Choices {
		if text[int64(i)] != ch.Text {
			t.Errorf("choice %d streamed %q, not streamed %q", i, text[int64(i)], ch.Text)
		}
	}
	if usage != 32 {
		t.Errorf("streamed usage %d completion tokens, want 32", usage)
	}
}

func TestOpenAIClientErrors(t *testing.T) {
	c := poolConfig(64)
	c.MaxModelLen = 512
	c.OnOverflow = OverflowOOM
	c.TimeScale = 0.05
	_, base := startServer(t, c)
	client := newClient(base)
	ctx := context.Background()

	_, err := client.Completions.New(ctx, openai.CompletionNewParams{Model: "nope",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(apiErr.Message, "does not exist") || apiErr.Param != "model" {
		t.Fatalf("wrong model: %v", err)
	}

	// A stream under way when the GPU runs out of memory ends with an error
	// the client reports as such.
	long := func() openai.CompletionNewParams {
		toks := make([]int64, 100)
		for i := range toks {
			toks[i] = int64(i + 1)
		}
		return openai.CompletionNewParams{Model: "llama-3-8b", MaxTokens: openai.Int(400),
			Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: toks}}
	}
	stream := client.Completions.NewStreaming(ctx, long())
	if !stream.Next() {
		t.Fatalf("no first chunk: %v", stream.Err())
	}
	done := make(chan error, 3)
	for range 3 {
		go func() { _, err := client.Completions.New(ctx, long()); done <- err }()
	}
	for stream.Next() {
	}
	var se *ssestream.StreamError
	if err := stream.Err(); !errors.As(err, &se) || !strings.Contains(err.Error(), "CUDA out of memory") {
		t.Fatalf("stream error = %v, want a stream error with CUDA out of memory", err)
	}
	timeout := time.After(30 * time.Second)
	for range 3 {
		select {
		case err := <-done:
			if !errors.As(err, &apiErr) || (apiErr.StatusCode != 500 && apiErr.StatusCode != 503) {
				t.Errorf("request over the pool: %v", err)
			}
		case <-timeout:
			t.Fatal("requests over the pool never ended")
		}
	}
}
