package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fastjson"
)

// maxErrorBody bounds how much of an error response is read for its message.
const maxErrorBody = 64 << 10

// maxLine bounds one SSE line; a chunk is a few hundred bytes.
const maxLine = 4 << 20

// Outcome is how one request ended. Every request ends in exactly one.
type Outcome int

const (
	// OutcomeOK: a complete response (the stream reached [DONE] or a
	// finish_reason; a plain response parsed).
	OutcomeOK Outcome = iota
	// OutcomeShed: HTTP 429, the server (or a gateway) declined it. Not a
	// failure: shedding is the behaviour a gateway is for.
	OutcomeShed
	// OutcomeClientError: any other 4xx.
	OutcomeClientError
	// OutcomeServerError: 5xx, or an error event in the stream, that is not
	// an out-of-memory error.
	OutcomeServerError
	// OutcomeOverflow: the GPU ran out of memory serving it ("CUDA out of
	// memory" in an error body or a stream error event), whatever the
	// status but 503: a 503 refuses the request, as a server restarting
	// after an earlier out-of-memory error does, and is a server error.
	OutcomeOverflow
	// OutcomeConnError: no usable response (refused, reset, a stream cut
	// short without [DONE]).
	OutcomeConnError
	// OutcomeTimeout: the request exceeded its time limit.
	OutcomeTimeout
	// OutcomeIncomplete: the step was cut (over-saturation, max step time,
	// interrupt) while the request was in flight. It is left out of every
	// figure, as it says nothing about the server.
	OutcomeIncomplete
	// OutcomeDropped: an open-loop arrival found the client at its in-flight
	// limit and was not sent; the client, not the server, was the limit.
	OutcomeDropped
)

var outcomeNames = [...]string{"ok", "shed_429", "client_4xx", "server_5xx", "overflow", "conn_error", "timeout", "incomplete", "dropped"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// RequestSpec is one request to send.
type RequestSpec struct {
	Index  int
	Prompt string
	// System opens the request when not empty: a system message on chat,
	// the prompt's start on completions.
	System string
	// History is a session's earlier turns, sent between System and Prompt.
	History      []Turn
	PromptTokens int // the length aimed at, System and History included
	MaxTokens    int
	// KeepText asks the sender for the generated text in Result.Text.
	KeepText bool
}

// Turn is one earlier exchange of a session: what the user sent and what
// the assistant answered.
type Turn struct {
	User, Assistant string
}

// Result is what one request measured. Times are read from the sender's
// clock; TTFT and ITL exist only for streamed responses that produced content.
type Result struct {
	Index        int
	Outcome      Outcome
	Status       int
	Err          string // error message (the server's, or the transport's)
	Start        time.Time
	FirstToken   time.Time // zero when no content arrived
	End          time.Time
	ITL          []time.Duration
	OutputTokens int    // usage.completion_tokens, else content chunks
	PromptTokens int    // usage.prompt_tokens, else the spec's target
	Text         string // the generated text, when the spec asked for it
}

// TTFT is the time to the first content chunk (whole response when not
// streamed); 0 when none arrived.
func (r *Result) TTFT() time.Duration {
	if r.FirstToken.IsZero() {
		return 0
	}
	return r.FirstToken.Sub(r.Start)
}

// E2E is the end-to-end latency.
func (r *Result) E2E() time.Duration { return r.End.Sub(r.Start) }

// Sender sends one request and measures it. Implementations must honour
// ctx: when it is done the request ends (OutcomeIncomplete).
type Sender interface {
	Send(ctx context.Context, spec RequestSpec) Result
}

// httpSender speaks the OpenAI API over HTTP and measures the stream the way
// vLLM's benchmark_serving does: the clock starts just before the request is
// written, TTFT is the arrival of the first chunk carrying content (text,
// delta.content or delta.reasoning_content; role-only and usage-only chunks
// do not count), every later content chunk adds one inter-token gap, and the
// end is the arrival of [DONE] (or the end of a complete body).
type httpSender struct {
	client    *http.Client
	url       string // full endpoint URL
	model     string
	chat      bool
	stream    bool
	ignoreEOS bool
	apiKey    string
	timeout   time.Duration
	clock     Clock
	parsers   fastjson.ParserPool
	readers   sync.Pool // *bufio.Reader, one a stream in flight
}

var _ Sender = (*httpSender)(nil)

// errRequestTimeout is the cancellation cause of a request over its limit.
var errRequestTimeout = errors.New("request timeout")

// NewHTTPClient returns a client tuned for a load test: connections are kept
// and reused up to maxConns per host so a level of N streams holds N
// connections rather than dialling per request, no compression (a gzip
// reader would buffer the stream), no proxy (the target is measured, not
// the path to it), and no client-wide timeout (each request has its own).
func NewHTTPClient(maxConns int) *http.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: max(maxConns, 16),
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
		DisableCompression:  true,
		ReadBufferSize:      32 << 10,
		WriteBufferSize:     32 << 10,
	}
	return &http.Client{Transport: tr}
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type requestBody struct {
	Model         string         `json:"model"`
	Messages      []chatMessage  `json:"messages,omitempty"`
	Prompt        string         `json:"prompt,omitempty"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	Temperature   float64        `json:"temperature"`
	// vLLM extensions that pin the output length to max_tokens, so every
	// level carries the same work.
	IgnoreEOS bool `json:"ignore_eos,omitempty"`
	MinTokens int  `json:"min_tokens,omitempty"`
}

func (s *httpSender) body(spec RequestSpec) ([]byte, error) {
	b := requestBody{Model: s.model, MaxTokens: spec.MaxTokens, Stream: s.stream}
	if s.chat {
		b.Messages = make([]chatMessage, 0, 2+2*len(spec.History))
		if spec.System != "" {
			b.Messages = append(b.Messages, chatMessage{Role: "system", Content: spec.System})
		}
		for _, t := range spec.History {
			b.Messages = append(b.Messages, chatMessage{Role: "user", Content: t.User}, chatMessage{Role: "assistant", Content: t.Assistant})
		}
		b.Messages = append(b.Messages, chatMessage{Role: "user", Content: spec.Prompt})
	} else {
		// A completion has no roles: the parts run on, one space apart.
		var p strings.Builder
		if spec.System != "" {
			p.WriteString(spec.System)
			p.WriteByte(' ')
		}
		for _, t := range spec.History {
			p.WriteString(t.User)
			p.WriteByte(' ')
			p.WriteString(t.Assistant)
			p.WriteByte(' ')
		}
		p.WriteString(spec.Prompt)
		b.Prompt = p.String()
	}
	if s.stream {
		b.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if s.ignoreEOS {
		b.IgnoreEOS, b.MinTokens = true, spec.MaxTokens
	}
	return json.Marshal(b)
}

// Send sends spec and measures it.
func (s *httpSender) Send(parent context.Context, spec RequestSpec) Result {
	res := Result{Index: spec.Index, PromptTokens: spec.PromptTokens}
	body, err := s.body(spec)
	if err != nil {
		res.Outcome, res.Err = OutcomeClientError, err.Error()
		res.Start = s.clock.Now()
		res.End = res.Start
		return res
	}
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		res.Outcome, res.Err = OutcomeClientError, err.Error()
		res.Start = s.clock.Now()
		res.End = res.Start
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	if s.stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	if s.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.apiKey)
	}
	if s.timeout > 0 {
		done := make(chan struct{})
		defer close(done)
		after := s.clock.After(s.timeout)
		go func() {
			select {
			case <-after:
				cancel(errRequestTimeout)
			case <-done:
			}
		}()
	}
	res.Start = s.clock.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		s.fail(ctx, parent, &res, err)
		return res
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		res.End = s.clock.Now()
		res.Err = errorMessage(msg, resp.Status)
		switch {
		case resp.StatusCode == http.StatusServiceUnavailable:
			// Refused, not overflowed: a server restarting after an
			// earlier out-of-memory error says so in its 503s.
			res.Outcome = OutcomeServerError
		case isOOM(string(msg)):
			res.Outcome = OutcomeOverflow
		case resp.StatusCode == http.StatusTooManyRequests:
			res.Outcome = OutcomeShed
		case resp.StatusCode >= 500:
			res.Outcome = OutcomeServerError
		case resp.StatusCode >= 400:
			res.Outcome = OutcomeClientError
		default:
			res.Outcome = OutcomeServerError // 1xx/3xx: not an answer
		}
		return res
	}
	if s.stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		res.ITL = make([]time.Duration, 0, min(max(spec.MaxTokens-1, 0), 8192))
		s.readStream(ctx, parent, resp.Body, &res, spec.KeepText)
	} else {
		s.readWhole(ctx, parent, resp.Body, &res, spec.KeepText)
	}
	return res
}

// fail classifies a transport error.
func (s *httpSender) fail(ctx, parent context.Context, res *Result, err error) {
	res.End = s.clock.Now()
	res.Err = err.Error()
	switch {
	case errors.Is(context.Cause(ctx), errRequestTimeout):
		res.Outcome, res.Err = OutcomeTimeout, fmt.Sprintf("no complete response within %s", s.timeout)
	case parent.Err() != nil:
		res.Outcome = OutcomeIncomplete
	default:
		res.Outcome = OutcomeConnError
	}
}

func (s *httpSender) readStream(ctx, parent context.Context, body io.Reader, res *Result, keepText bool) {
	br, _ := s.readers.Get().(*bufio.Reader)
	if br == nil {
		br = bufio.NewReaderSize(body, 32<<10)
	} else {
		br.Reset(body)
	}
	defer func() {
		br.Reset(nil) // drop the body
		s.readers.Put(br)
	}()
	p := s.parsers.Get()
	defer s.parsers.Put(p)
	var (
		last     time.Time
		chunks   int
		usage    = -1
		finished bool
		errEvent bool
		long     []byte
		text     strings.Builder
	)
	for {
		frag, err := br.ReadSlice('\n')
		now := s.clock.Now()
		if errors.Is(err, bufio.ErrBufferFull) {
			if len(long)+len(frag) > maxLine {
				res.End, res.Outcome, res.Err = now, OutcomeServerError, "SSE line longer than 4 MiB"
				return
			}
			long = append(long, frag...)
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			s.fail(ctx, parent, res, err)
			return
		}
		line := frag
		if len(long) > 0 {
			line = append(long, frag...)
			long = long[:0]
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0, line[0] == ':':
			// Event separator, or a comment (a gateway's queue heartbeat).
		case bytes.HasPrefix(line, []byte("event:")):
			errEvent = bytes.Equal(bytes.TrimSpace(line[len("event:"):]), []byte("error"))
		case bytes.HasPrefix(line, []byte("data:")):
			data := bytes.TrimSpace(line[len("data:"):])
			if bytes.Equal(data, []byte("[DONE]")) {
				res.End = now
				s.finish(res, chunks, usage)
				res.Text = text.String()
				return
			}
			v, perr := p.ParseBytes(data)
			if perr != nil {
				if errEvent {
					res.End, res.Err = now, truncate(string(data), 300)
					res.Outcome = classifyStreamError(res.Err)
					return
				}
				break // not JSON and not an error: skipped, as clients do
			}
			if msg, isErr := chunkError(v); isErr || errEvent {
				if !isErr {
					msg = string(data)
				}
				res.End, res.Err = now, truncate(msg, 300)
				res.Outcome = classifyStreamError(msg)
				return
			}
			content, fin := chunkContent(v)
			if content && keepText {
				appendText(&text, v, "delta", "content")
			}
			if u := v.Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
				if u.Exists("completion_tokens") {
					usage = u.GetInt("completion_tokens")
				}
				if n := u.GetInt("prompt_tokens"); n > 0 {
					res.PromptTokens = n
				}
			}
			if content {
				if chunks == 0 {
					res.FirstToken = now
				} else {
					res.ITL = append(res.ITL, now.Sub(last))
				}
				last = now
				chunks++
			}
			finished = finished || fin
		}
		if err != nil { // io.EOF
			res.End = now
			if finished {
				// [DONE] is optional in practice once every choice has a
				// finish_reason; the response is complete.
				s.finish(res, chunks, usage)
				res.Text = text.String()
				return
			}
			res.Outcome, res.Err = OutcomeConnError, "stream ended before [DONE]"
			return
		}
	}
}

func (s *httpSender) finish(res *Result, chunks, usage int) {
	res.Outcome = OutcomeOK
	res.OutputTokens = chunks
	if usage >= 0 {
		res.OutputTokens = usage
	}
}

func (s *httpSender) readWhole(ctx, parent context.Context, body io.Reader, res *Result, keepText bool) {
	data, err := io.ReadAll(io.LimitReader(body, 64<<20))
	now := s.clock.Now()
	if err != nil {
		s.fail(ctx, parent, res, err)
		return
	}
	res.End = now
	p := s.parsers.Get()
	defer s.parsers.Put(p)
	v, err := p.ParseBytes(data)
	if err != nil {
		res.Outcome, res.Err = OutcomeServerError, "response is not JSON: "+truncate(string(data), 200)
		return
	}
	if msg, isErr := chunkError(v); isErr {
		res.Err = msg
		res.Outcome = classifyStreamError(msg)
		return
	}
	// Without a stream the first token is only seen with the last.
	res.FirstToken = now
	res.Outcome = OutcomeOK
	if keepText {
		var text strings.Builder
		appendText(&text, v, "message", "content")
		res.Text = text.String()
	}
	if u := v.Get("usage"); u != nil {
		res.OutputTokens = u.GetInt("completion_tokens")
		if n := u.GetInt("prompt_tokens"); n > 0 {
			res.PromptTokens = n
		}
	}
}

// chunkContent reports whether a chunk carries generated output — text,
// content, a reasoning model's reasoning (vLLM's "reasoning", formerly
// "reasoning_content") or a piece of a tool call — and whether a choice
// finished in it.
func chunkContent(v *fastjson.Value) (content, finished bool) {
	for _, c := range v.GetArray("choices") {
		if len(c.GetStringBytes("text")) > 0 ||
			len(c.GetStringBytes("delta", "content")) > 0 ||
			len(c.GetStringBytes("delta", "reasoning_content")) > 0 ||
			len(c.GetStringBytes("delta", "reasoning")) > 0 ||
			len(c.GetArray("delta", "tool_calls")) > 0 {
			content = true
		}
		if f := c.Get("finish_reason"); f != nil && f.Type() != fastjson.TypeNull {
			finished = true
		}
	}
	return content, finished
}

// appendText adds the first choice's text to b: a completion's text, or
// the chat content at path (delta.content in a stream, message.content in a
// whole answer).
func appendText(b *strings.Builder, v *fastjson.Value, path ...string) {
	cs := v.GetArray("choices")
	if len(cs) == 0 {
		return
	}
	b.Write(cs[0].GetStringBytes("text"))
	b.Write(cs[0].GetStringBytes(path...))
}

// chunkError recognises the error shapes OpenAI-compatible servers put in a
// body or a stream: {"error": {"message": …}}, {"error": "…"} and vLLM's
// older {"object": "error", "message": …}.
func chunkError(v *fastjson.Value) (string, bool) {
	if e := v.Get("error"); e != nil && e.Type() != fastjson.TypeNull {
		if e.Type() == fastjson.TypeString {
			return string(e.GetStringBytes()), true
		}
		if m := e.GetStringBytes("message"); m != nil {
			return string(m), true
		}
		return e.String(), true
	}
	if string(v.GetStringBytes("object")) == "error" {
		return string(v.GetStringBytes("message")), true
	}
	return "", false
}

func classifyStreamError(msg string) Outcome {
	if isOOM(msg) {
		return OutcomeOverflow
	}
	return OutcomeServerError
}

// isOOM recognises a GPU out-of-memory error: PyTorch's "CUDA out of
// memory" and torch.OutOfMemoryError, however the server wrapped them.
func isOOM(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "out of memory") || strings.Contains(m, "outofmemoryerror")
}

// errorMessage extracts the message of an error body, else a short raw form.
func errorMessage(body []byte, status string) string {
	var p fastjson.Parser
	if v, err := p.ParseBytes(body); err == nil {
		if msg, ok := chunkError(v); ok && msg != "" {
			return status + ": " + truncate(msg, 300)
		}
	}
	if t := strings.TrimSpace(string(body)); t != "" {
		return status + ": " + truncate(t, 300)
	}
	return status
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
