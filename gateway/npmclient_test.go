package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// npmClientDir is the Node project that drives the npm openai client.
const npmClientDir = "testdata/npmclient"

// npmClientResult is the line test.mjs prints.
type npmClientResult struct {
	OK   bool `json:"ok"`
	Chat struct {
		Content          string `json:"content"`
		FinishReason     string `json:"finish_reason"`
		CompletionTokens int    `json:"completion_tokens"`
	} `json:"chat"`
	ChatStream struct {
		Content      string `json:"content"`
		Chunks       int    `json:"chunks"`
		FinishReason string `json:"finish_reason"`
	} `json:"chat_stream"`
	Completion struct {
		Text             string `json:"text"`
		CompletionTokens int    `json:"completion_tokens"`
	} `json:"completion"`
	Embedding struct {
		Count          int    `json:"count"`
		Dims           int    `json:"dims"`
		PromptTokens   int    `json:"prompt_tokens"`
		EncodingFormat string `json:"encoding_format"`
		MatchesFloat   bool   `json:"matches_float"`
	} `json:"embedding"`
	Response struct {
		Text         string `json:"text"`
		OutputTokens int    `json:"output_tokens"`
	} `json:"response"`
	ResponseStream struct {
		Text         string `json:"text"`
		Deltas       int    `json:"deltas"`
		OutputTokens int    `json:"output_tokens"`
		Status       string `json:"status"`
	} `json:"response_stream"`
	Models struct {
		IDs []string `json:"ids"`
	} `json:"models"`
	UnknownModel struct {
		Error  string `json:"error"`
		Status int    `json:"status"`
		Code   string `json:"code"`
		Param  string `json:"param"`
	} `json:"unknown_model"`
	Detokenize struct {
		Text   string `json:"text"`
		Tokens int    `json:"tokens"`
	} `json:"detokenize"`
	CountTokens struct {
		Short        int `json:"short"`
		Long         int `json:"long"`
		UnknownModel struct {
			Error  string `json:"error"`
			Status int    `json:"status"`
			Type   string `json:"type"`
		} `json:"unknown_model"`
	} `json:"count_tokens"`
}

// needNode is the node binary, with the npm openai client and Anthropic's
// SDK installed beside test.mjs. CI installs both (.ci/run), so there a missing one fails the
// test; elsewhere the test is skipped, saying how to install.
func needNode(t *testing.T) string {
	t.Helper()
	const install = "install the client with: npm ci --prefix gateway/testdata/npmclient (Node.js 20 or later; on Debian: apt-get install nodejs npm)"
	missing := func(what string) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s under CI, which must install it: %s", what, install)
		}
		t.Skipf("%s; %s", what, install)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not on PATH")
	}
	for _, pkg := range []string{"openai", "@anthropic-ai/sdk"} {
		if _, err := os.Stat(filepath.Join(npmClientDir, "node_modules", pkg, "package.json")); err != nil {
			missing("the npm package " + pkg + " is not installed in " + npmClientDir)
		}
	}
	return node
}

// TestNPMOpenAIClientThroughGateway: the npm openai client, as a Node app
// uses it, through the gateway to the simulated vLLM: chat plain and
// streamed, a completion, embeddings (which it asks for in base64 and
// decodes itself, checked against the same in floats), the Responses API
// plain and streamed, the model list, an unknown model raised as its
// NotFoundError, and vLLM's /tokenize then /detokenize through the client's
// fetch; then Anthropic's SDK counting tokens on /v1/messages/count_tokens,
// and raising an unknown model there as its NotFoundError.
func TestNPMOpenAIClientThroughGateway(t *testing.T) {
	node := needNode(t)
	backend, url := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "test.mjs")
	cmd.Dir = npmClientDir
	cmd.Env = append(os.Environ(), "KVGATE_BASE_URL="+gwURL+"/v1", "KVGATE_MODEL=llama-3-8b")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Past the deadline node is killed; WaitDelay bounds the wait for its
	// output pipes should anything it started still hold them.
	cmd.WaitDelay = 5 * time.Second
	runErr := cmd.Run()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("node test.mjs did not finish in time\nstdout: %s\nstderr: %s", &stdout, &stderr)
	}
	if runErr != nil {
		t.Fatalf("node test.mjs: %v\nstdout: %s\nstderr: %s", runErr, &stdout, &stderr)
	}
	var r npmClientResult
	line := strings.TrimSpace(stdout.String())
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("test.mjs printed no JSON line: %v\n%s\nstderr: %s", err, line, &stderr)
	}

	t.Logf("npm openai client: %s", line)
	checks := []struct {
		name string
		ok   bool
	}{
		{"ok", r.OK},
		{"chat", r.Chat.Content != "" && r.Chat.FinishReason == "length" && r.Chat.CompletionTokens == 5},
		{"chat_stream", r.ChatStream.Content != "" && r.ChatStream.Chunks >= 10 && r.ChatStream.FinishReason == "length"},
		{"completion", r.Completion.Text != "" && r.Completion.CompletionTokens == 7},
		{"embedding", r.Embedding.Count == 2 && r.Embedding.Dims > 0 && r.Embedding.PromptTokens > 0 &&
			r.Embedding.EncodingFormat == "base64" && r.Embedding.MatchesFloat},
		{"response", r.Response.Text != "" && r.Response.OutputTokens == 6},
		{"response_stream", r.ResponseStream.Text != "" && r.ResponseStream.Deltas >= 9 && r.ResponseStream.OutputTokens == 9 && r.ResponseStream.Status == "incomplete"},
		{"models", len(r.Models.IDs) == 1 && r.Models.IDs[0] == "llama-3-8b"},
		{"unknown_model", r.UnknownModel.Error == "NotFoundError" && r.UnknownModel.Status == 404 &&
			r.UnknownModel.Code == "model_not_found" && r.UnknownModel.Param == "model"},
		{"detokenize", r.Detokenize.Text == "Hello, world! 12345 ünïcödé" && r.Detokenize.Tokens > 5},
		{"count_tokens", r.CountTokens.Short > 0 && r.CountTokens.Long > r.CountTokens.Short &&
			r.CountTokens.UnknownModel.Error == "NotFoundError" && r.CountTokens.UnknownModel.Status == 404 &&
			r.CountTokens.UnknownModel.Type == "not_found_error"},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: not as expected in %s", c.name, line)
		}
	}
	eventually(t, "reservations to return", func() bool { return held(gw) == 0 })
	if st := backend.Stats(); st.Running != 0 || st.UsedBlocks != 0 {
		t.Errorf("backend still busy: %+v", st)
	}
}
