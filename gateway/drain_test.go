package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission/admissiontest"
)

// SIGTERM's drain (Server.Drain), on the gateway's clock: /readyz answers
// 503 at once; for drain_delay the listener serves on, a stream already
// running and steady traffic alike; then the listener closes, the stream in
// flight finishes, and the gateway stops.
func TestDrainServesThroughDrainDelayThenStops(t *testing.T) {
	release := make(chan struct{}) // lets the held stream end
	backend := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch {
		case bytes.Contains(ctx.PostBody(), []byte(`"stream":true`)):
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				w.Write(cannedToken)
				w.Flush()
				<-release
				w.Write(cannedLast)
				w.Flush()
			})
		default:
			ctx.SetContentType("application/json")
			ctx.WriteString(`{"choices":[{"index":0,"message":{"content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
		}
	}}
	backendURL := serveLoopback(t, backend.Serve, backend.ShutdownWithContext)
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	clock := admissiontest.NewClock(time.Unix(1e9, 0))
	cfg := strings.Replace(baseConfig(backendURL, "server: {drain_delay: 5s}\n"), "tokenizer: backend", "tokenizer: estimate", 1)
	gw, gwURL := startGateway(t, cfg, Options{DisableProbes: true, Clock: clock})
	client := &http.Client{Transport: &http.Transport{}}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := client.Get(gwURL + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("/readyz before the drain: %d %s", code, body)
	}

	// A stream under way when the drain begins.
	resp, err := client.Post(gwURL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hi", 8, true)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	stream := bufio.NewReader(resp.Body)
	if line, err := stream.ReadString('\n'); err != nil || !strings.Contains(line, `" one"`) {
		t.Fatalf("first event %q: %v", line, err)
	}

	stopped := gw.Drain()

	code, body := get("/readyz")
	var e errorBody
	if code != 503 || json.Unmarshal([]byte(body), &e) != nil || e.Error.Code == nil || *e.Error.Code != "draining" {
		t.Fatalf("/readyz once draining: %d %s", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz while draining: %d (the process is alive; only readiness turns)", code)
	}
	// Steady traffic through drain_delay is served, each answer asking its
	// client to reconnect (elsewhere).
	type answer struct {
		status int
		closed bool // the answer said Connection: close
		err    error
	}
	var wg sync.WaitGroup
	answers := make(chan answer, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := client.Post(gwURL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hi", 4, false)))
			if err != nil {
				answers <- answer{err: err}
				return
			}
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			answers <- answer{status: r.StatusCode, closed: r.Close}
		}()
	}
	wg.Wait()
	close(answers)
	for a := range answers {
		if a.err != nil || a.status != 200 {
			t.Fatalf("a request during drain_delay: %d %v", a.status, a.err)
		}
		if !a.closed {
			t.Errorf("an answer during the drain keeps its connection open")
		}
	}
	select {
	case err := <-stopped:
		t.Fatalf("the gateway stopped before drain_delay: %v", err)
	default:
	}

	clock.Advance(5 * time.Second) // drain_delay is over: the listener closes
	// The stream still running holds the shutdown up.
	select {
	case err := <-stopped:
		t.Fatalf("the gateway stopped with a stream in flight: %v", err)
	default:
	}
	close(release)
	rest, err := io.ReadAll(stream)
	if err != nil || !bytes.HasSuffix(rest, []byte("data: [DONE]\n\n")) || bytes.Contains(rest, []byte(`"error"`)) {
		t.Fatalf("the stream in flight was cut: %v\n%s", err, rest)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("drain: %v", err)
	}
	if c, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://")); err == nil {
		c.Close()
		t.Fatal("the gateway still accepts connections after the drain")
	}
	if err := <-gw.Drain(); err == nil {
		t.Error("a second drain reported nothing")
	}
}
