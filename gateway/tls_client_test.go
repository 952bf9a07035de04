package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/testcerts"
)

// tapBody keeps a copy of what a response body gave its reader, so a test
// can see the bytes on the wire beneath what the SDK hands back: the SDK
// ends a stream alike on [DONE] and on a bare EOF.
type tapBody struct {
	io.ReadCloser
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *tapBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	b.buf.Write(p[:n])
	b.mu.Unlock()
	return n, err
}

func (b *tapBody) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// tlsTap is an openai-go middleware recording each response's TLS state
// and body.
type tlsTap struct {
	mu     sync.Mutex
	states []*tls.ConnectionState
	bodies []*tapBody
}

func (tp *tlsTap) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	resp, err := next(req)
	if err != nil {
		return resp, err
	}
	body := &tapBody{ReadCloser: resp.Body}
	resp.Body = body
	tp.mu.Lock()
	tp.states = append(tp.states, resp.TLS)
	tp.bodies = append(tp.bodies, body)
	tp.mu.Unlock()
	return resp, nil
}

// last is the most recent response's TLS state and body.
func (tp *tlsTap) last(t *testing.T) (*tls.ConnectionState, *tapBody) {
	t.Helper()
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if len(tp.bodies) == 0 {
		t.Fatal("no response went through the client")
	}
	return tp.states[len(tp.states)-1], tp.bodies[len(tp.bodies)-1]
}

// openAITLSClient is openai-go talking to the gateway at https://addr with
// an http.Client trusting roots; it does not retry, so a failure is the
// first answer's.
func openAITLSClient(addr string, roots *x509.CertPool, tap *tlsTap) openai.Client {
	hc := &http.Client{
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}},
		Timeout:   30 * time.Second,
	}
	opts := []option.RequestOption{
		option.WithBaseURL("https://" + addr + "/v1/"),
		option.WithAPIKey("unused"),
		option.WithMaxRetries(0),
		option.WithHTTPClient(hc),
	}
	if tap != nil {
		opts = append(opts, option.WithMiddleware(tap.middleware))
	}
	return openai.NewClient(opts...)
}

// TestOpenAIClientTLSBothWays: openai-go, trusting the gateway's CA,
// talks HTTPS to the gateway, which talks HTTPS to the simulated vLLM
// with the backend's CA: chat, a streamed chat read to its [DONE], and a
// completion. The same client trusting another CA is refused at the
// handshake with the certificate problem named; a backend whose CA the
// gateway does not trust gives the client a 502 in OpenAI's shape.
func TestOpenAIClientTLSBothWays(t *testing.T) {
	dir := t.TempDir()
	gwCA, beCA, other := testcerts.NewCA(t, "gateway CA"), testcerts.NewCA(t, "backend CA"), testcerts.NewCA(t, "other CA")
	certFile, keyFile := gwCA.Server(t, "gateway").Write(t, dir, "gateway")
	beCAFile, otherFile := filepath.Join(dir, "backend-ca.pem"), filepath.Join(dir, "other.pem")
	testcerts.WriteFile(t, beCAFile, beCA.CertPEM)
	testcerts.WriteFile(t, otherFile, other.CertPEM)
	simURL := startTLSSim(t, beCA.Server(t, "sim").TLS(t))
	serverTLS := "server:\n  tls: {cert_file: " + certFile + ", key_file: " + keyFile + "}\n"

	// gateway serves TLS in front of the TLS simulator, trusting backendCA.
	gateway := func(t *testing.T, backendCA string) (*Server, string) {
		t.Helper()
		cfg := withBackendTLS(baseConfig(simURL, serverTLS), simURL, "{ca_file: "+backendCA+"}")
		// No probes: each request meets the backend itself, so the 502
		// below is the handshake's and not an open circuit's 503.
		s, gw := startGateway(t, cfg, Options{DisableProbes: true})
		return s, strings.TrimPrefix(gw, "http://")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("both hops trusted", func(t *testing.T) {
		s, addr := gateway(t, beCAFile)
		tap := &tlsTap{}
		client := openAITLSClient(addr, gwCA.Pool(), tap)
		overTLS := func(what string) {
			t.Helper()
			st, _ := tap.last(t)
			if st == nil || st.Version < tls.VersionTLS12 || len(st.PeerCertificates) == 0 || st.PeerCertificates[0].Subject.CommonName != "gateway" {
				t.Errorf("%s: not served over TLS 1.2+ with the gateway's certificate: %+v", what, st)
			}
		}

		chat, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "llama-3-8b",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello in five words.")},
			MaxTokens: openai.Int(5),
		})
		if err != nil {
			t.Fatalf("chat: %v", err)
		}
		if len(chat.Choices) != 1 || chat.Choices[0].Message.Content == "" || chat.Usage.CompletionTokens != 5 {
			t.Errorf("chat: %+v", chat)
		}
		overTLS("chat")

		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:     "llama-3-8b",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Count to ten.")},
			MaxTokens: openai.Int(10),
		})
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		if chunks < 10 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" || acc.Choices[0].FinishReason != "length" {
			t.Errorf("stream: %d chunks, %+v", chunks, acc.Choices)
		}
		overTLS("stream")
		if _, body := tap.last(t); !strings.HasSuffix(body.String(), "data: [DONE]\n\n") {
			t.Errorf("the stream did not end with [DONE]:\n%s", body)
		}

		comp, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel("llama-3-8b"),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(7),
		})
		if err != nil {
			t.Fatalf("completion: %v", err)
		}
		if len(comp.Choices) != 1 || comp.Choices[0].Text == "" || comp.Usage.CompletionTokens != 7 {
			t.Errorf("completion: %+v", comp)
		}
		overTLS("completion")
		eventually(t, "reservations to return", func() bool { return held(s) == 0 })
	})

	t.Run("client trusts another CA", func(t *testing.T) {
		_, addr := gateway(t, beCAFile)
		client := openAITLSClient(addr, other.Pool(), nil)
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "llama-3-8b",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
			MaxTokens: openai.Int(3),
		})
		var unknown x509.UnknownAuthorityError
		if err == nil || !errors.As(err, &unknown) || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Fatalf("error %v; want the handshake refused naming the unknown authority", err)
		}
		if unknown.Cert == nil || unknown.Cert.Subject.CommonName != "gateway" {
			t.Errorf("the refused certificate is %+v; want the gateway's", unknown.Cert)
		}
	})

	// One gateway each: the first handshake failure counts against the
	// backend's circuit, and the next request would get an open circuit's
	// 503 instead.
	for _, streamed := range []bool{false, true} {
		name := "gateway does not trust the backend's CA"
		if streamed {
			name += ", streamed"
		}
		t.Run(name, func(t *testing.T) {
			s, addr := gateway(t, otherFile)
			client := openAITLSClient(addr, gwCA.Pool(), nil)
			params := openai.ChatCompletionNewParams{
				Model:     "llama-3-8b",
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
				MaxTokens: openai.Int(3),
			}
			var err error
			if streamed {
				// Refused before the first byte, a stream's failure is the
				// same answer, not an event inside a 200.
				stream := client.Chat.Completions.NewStreaming(ctx, params)
				for stream.Next() {
					t.Errorf("an event from a backend never reached: %+v", stream.Current())
				}
				err = stream.Err()
			} else {
				_, err = client.Chat.Completions.New(ctx, params)
			}
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("error %v; want the gateway's answer", err)
			}
			if apiErr.StatusCode != 502 || apiErr.Type != typeServer || apiErr.Code != "upstream_error" ||
				apiErr.Message != `The backend "gpu0" could not be reached: its TLS handshake failed.` {
				t.Errorf("%d %s", apiErr.StatusCode, apiErr.RawJSON())
			}
			if host := strings.TrimPrefix(simURL, "https://"); strings.Contains(apiErr.RawJSON(), host) {
				t.Errorf("the 502 shows the backend's address: %s", apiErr.RawJSON())
			}
			eventually(t, "reservations to return", func() bool { return held(s) == 0 })
		})
	}
}
