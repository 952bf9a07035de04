package loadtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestHundredsOfStreamsOnReusedConnections: 300 workers hold 300 streams at
// once (the server answers nobody until all 300 have arrived, so a client
// that serialised or pooled below 300 would hang here), and a second round
// reuses the same 300 connections instead of dialling again.
func TestHundredsOfStreamsOnReusedConnections(t *testing.T) {
	const n = 300
	var arrived atomic.Int64
	all := make(chan struct{})
	var newConns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived.Add(1) == n {
			close(all)
		}
		<-all
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 8 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			newConns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	s := testSender(srv.URL, SystemClock{})
	s.client = NewHTTPClient(n + 16)
	defer s.client.CloseIdleConnections()
	for round := range 2 {
		a := runAttempt(context.Background(), SystemClock{}, s, specOf, stepConfig{Mode: ModeConcurrency, Level: n, Requests: n})
		ok := 0
		for _, r := range a.results {
			if r.Outcome == OutcomeOK && r.OutputTokens == 8 {
				ok++
			}
		}
		if ok != n {
			t.Fatalf("round %d: %d of %d streams complete", round, ok, n)
		}
	}
	if c := newConns.Load(); c != n {
		t.Errorf("%d connections dialled for two rounds of %d streams, want %d (reused)", c, n, n)
	}
}

func streamBody(tokens int) string {
	var b strings.Builder
	b.WriteString(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n")
	for i := range tokens {
		fmt.Fprintf(&b, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"llama-3-8b","choices":[{"index":0,"delta":{"content":" word%d"},"logprobs":null,"finish_reason":null}]}`+"\n\n", i)
	}
	b.WriteString(`data: {"id":"c","choices":[],"usage":{"prompt_tokens":512,"completion_tokens":256,"total_tokens":768}}` + "\n\ndata: [DONE]\n\n")
	return b.String()
}

// BenchmarkReadStream is the client's hot path: one 256-token stream parsed
// and timed.
func BenchmarkReadStream(b *testing.B) {
	body := streamBody(256)
	s := testSender("http://unused", SystemClock{})
	ctx := context.Background()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var r Result
		s.readStream(ctx, ctx, strings.NewReader(body), &r, false)
		if r.Outcome != OutcomeOK || r.OutputTokens != 256 {
			b.Fatalf("%s %d", r.Outcome, r.OutputTokens)
		}
	}
}

// BenchmarkPromptBuild builds one 2048-token prompt, as each request does.
func BenchmarkPromptBuild(b *testing.B) {
	g := estimatedPromptGen()
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		if _, n := g.build(r, 2048); n != 2048 {
			b.Fatal(n)
		}
	}
}
