package gateway

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// Allocation benchmarks of the proxy path. The backend here is a canned
// fasthttp server that answers from memory without allocating, and the
// client is a fasthttp client, so that allocs/op is the gateway's own cost;
// each benchmark has a "direct" sub-benchmark (client and canned backend
// alone) to subtract.
//
//	go test -run XXX -bench 'Proxy|RelaySSE' -benchmem ./gateway

const cannedChat = `{"id":"chatcmpl-7ef2ba9abf4e22f2f24abafe4794c590","object":"chat.completion","created":1796286500,"model":"llama-3-8b","choices":[{"index":0,"message":{"role":"assistant","content":" one his way in big of be own her its way be use so but an","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":15,"total_tokens":31,"completion_tokens":16,"prompt_tokens_details":null}}`

var (
	cannedToken = []byte(`data: {"id":"chatcmpl-46a01c94c88e6a44e53a518cfa44fc1c","object":"chat.completion.chunk","created":1796286500,"model":"llama-3-8b","choices":[{"index":0,"delta":{"content":" one"},"logprobs":null,"finish_reason":null,"stop_reason":null}]}` + "\n\n")
	cannedLast  = []byte(`data: {"id":"chatcmpl-46a01c94c88e6a44e53a518cfa44fc1c","object":"chat.completion.chunk","created":1796286500,"model":"llama-3-8b","choices":[{"index":0,"delta":{"content":" end"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}` + "\n\n" +
		`data: {"id":"chatcmpl-46a01c94c88e6a44e53a518cfa44fc1c","object":"chat.completion.chunk","created":1796286500,"model":"llama-3-8b","choices":[],"usage":{"prompt_tokens":15,"total_tokens":18,"completion_tokens":3,"prompt_tokens_details":null}}` + "\n\ndata: [DONE]\n\n")
)

// startCanned serves a backend that answers every completion with the same
// body (or, streamed, that many token events then the end), /tokenize with
// a count, and /health with 200. The event count travels in X-Request-Id,
// which the gateway forwards.
func startCanned(b *testing.B) string {
	b.Helper()
	chat := []byte(cannedChat)
	tok := []byte(`{"count":15,"max_model_len":8192}`)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/tokenize":
			ctx.SetContentType("application/json")
			ctx.SetBody(tok)
		case "/v1/chat/completions", "/v1/completions":
			events := 0
			if id := ctx.Request.Header.Peek("X-Request-Id"); len(id) > 0 {
				events, _ = strconv.Atoi(string(id))
			}
			if events == 0 {
				ctx.SetContentType("application/json")
				ctx.SetBody(chat)
				return
			}
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				for range events - 1 {
					w.Write(cannedToken)
					w.Flush()
				}
				w.Write(cannedLast)
				w.Flush()
			})
		default:
			ctx.SetStatusCode(200)
		}
	}}
	return serveLoopback(b, srv.Serve, srv.ShutdownWithContext)
}

// benchGateway serves a gateway in front of url with the given tokenizer,
// probes off (the backend starts healthy) and a budget that never queues.
func benchGateway(b *testing.B, url, tokenizer string) string {
	b.Helper()
	cfg := strings.Replace(baseConfig(url, ""), "tokenizer: backend", "tokenizer: "+tokenizer, 1)
	cfg = strings.Replace(cfg, "gpu_memory: 24GiB", "gpu_memory: 24GiB\n    kv_budget: 1TiB", 1)
	_, gw := startGateway(b, cfg, Options{DisableProbes: true, AccessLog: io.Discard}) // the access log on, as serve writes it
	return gw
}

// BenchmarkProxyNonStreaming is one short non-streamed chat completion per
// op, over a kept-alive connection.
func BenchmarkProxyNonStreaming(b *testing.B) { benchProxy(b, 0) }

// BenchmarkProxyStreaming is one short streamed chat completion (16 token
// events) per op.
func BenchmarkProxyStreaming(b *testing.B) { benchProxy(b, 16) }

func benchProxy(b *testing.B, events int) {
	backend := startCanned(b)
	body := []byte(chatBody("What is a KV cache? Answer in one line.", 16, events > 0))
	targets := []struct{ name, url string }{
		{"direct", backend},
		{"gateway/tokenizer=estimate", benchGateway(b, backend, "estimate")},
		{"gateway/tokenizer=backend", benchGateway(b, backend, "backend")},
	}
	for _, tgt := range targets {
		b.Run(tgt.name, func(b *testing.B) {
			c := &fasthttp.HostClient{Addr: strings.TrimPrefix(tgt.url, "http://"), MaxConns: 1, ReadTimeout: 10 * time.Second}
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			do := func() {
				req.SetRequestURI(tgt.url + "/v1/chat/completions")
				req.Header.SetMethod("POST")
				req.Header.SetContentType("application/json")
				if events > 0 {
					req.Header.Set("X-Request-Id", strconv.Itoa(events))
				}
				req.SetBodyRaw(body)
				if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
				}
			}
			for range 100 { // warm connections and pools
				do()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				do()
			}
		})
	}
}

// BenchmarkRelaySSE is one SSE token event per op: a single streamed
// request whose backend sends b.N events, read to its end by the client.
func BenchmarkRelaySSE(b *testing.B) {
	backend := startCanned(b)
	body := []byte(chatBody("What is a KV cache? Answer in one line.", 16, true))
	targets := []struct{ name, url string }{
		{"direct", backend},
		{"gateway", benchGateway(b, backend, "estimate")},
	}
	for _, tgt := range targets {
		b.Run(tgt.name, func(b *testing.B) {
			c := &fasthttp.HostClient{Addr: strings.TrimPrefix(tgt.url, "http://"), MaxConns: 1, ReadTimeout: time.Minute, StreamResponseBody: true}
			stream := func(events int) int64 {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				req.SetRequestURI(tgt.url + "/v1/chat/completions")
				req.Header.SetMethod("POST")
				req.Header.SetContentType("application/json")
				req.Header.Set("X-Request-Id", strconv.Itoa(max(events, 1)))
				req.SetBodyRaw(body)
				if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("%v %d", err, resp.StatusCode())
				}
				n, err := io.Copy(io.Discard, resp.BodyStream())
				if err != nil {
					b.Fatal(err)
				}
				return n
			}
			stream(1000) // warm
			b.ReportAllocs()
			b.ResetTimer()
			if n := stream(b.N); n < int64(b.N)*int64(len(cannedToken)-1) {
				b.Fatalf("%d bytes relayed for %d events", n, b.N)
			}
		})
	}
}

// BenchmarkParseRequestSizes parses short and 4k-token chat bodies.
func BenchmarkParseRequestSizes(b *testing.B) {
	for _, tokens := range []int{16, 4096} {
		body := []byte(chatBody(words(tokens), 16, true))
		for _, tok := range []string{"estimate", "backend"} {
			b.Run(fmt.Sprintf("prompt=%d/tokenizer=%s", tokens, tok), func(b *testing.B) {
				var pp fastjson.ParserPool
				var p fastjson.Parser
				c := newTokenCache(16)
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					r, err := parseRequest(&p, body, chatCompletions)
					if err != nil {
						b.Fatal(err)
					}
					if tok == "backend" { // as far as a cache hit goes
						if err := promptTexts(&pp, body, r); err != nil {
							b.Fatal(err)
						}
						c.get(c.key(r, 0))
					}
				}
			})
		}
	}
}
