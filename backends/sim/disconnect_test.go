package sim

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// A client that goes away has its request aborted and its blocks freed at
// once, as vLLM aborts it: while streaming, and while waiting for a
// non-streamed answer or for its first token (connwatch sees the hang-up;
// a stream's failed write would too). Every test runs in real time, where the
// request would run for a minute, and fails if it outlives its client.

// rawRequest sends a completion over a bare TCP connection.
func rawRequest(t *testing.T, base, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return conn
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func idle(s *Server) bool {
	st := s.Stats()
	return st.Running == 0 && st.Waiting == 0 && st.UsedBlocks == 0
}

func TestStreamClientDisconnectAborts(t *testing.T) {
	s, base := startServer(t, DefaultConfig()) // 3000 tokens take 45 s
	conn := rawRequest(t, base, `{"model":"llama-3-8b","prompt":"a long story","max_tokens":3000,"stream":true}`)
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "data: {") {
			break
		}
	}
	if st := s.Stats(); st.Running != 1 || st.UsedBlocks == 0 {
		t.Fatalf("stream not running: %+v", st)
	}
	conn.Close()
	waitUntil(t, "the stream's request is aborted", func() bool { return idle(s) })
	if g := s.Stats().GenerationTokens; g > 1000 {
		t.Errorf("%d tokens generated for a client that left after the first", g)
	}
}

func TestNonStreamingClientDisconnectAborts(t *testing.T) {
	s, base := startServer(t, DefaultConfig())
	conn := rawRequest(t, base, `{"model":"llama-3-8b","prompt":"a long story","max_tokens":3000}`)
	waitUntil(t, "the request runs", func() bool { return s.Stats().GenerationTokens > 0 })
	conn.Close()
	waitUntil(t, "the request is aborted", func() bool { return idle(s) })
	if g := s.Stats().GenerationTokens; g > 1000 {
		t.Errorf("%d tokens generated for a client that left", g)
	}
}

func TestQueuedClientDisconnectLeavesQueue(t *testing.T) {
	c := DefaultConfig()
	c.MaxNumSeqs = 1 // the second request waits behind the first
	s, base := startServer(t, c)
	first := rawRequest(t, base, `{"model":"llama-3-8b","prompt":"first","max_tokens":3000}`)
	defer first.Close()
	waitUntil(t, "the first request runs", func() bool { return s.Stats().Running == 1 })
	admitted := s.Stats().PromptTokens
	for _, stream := range []bool{true, false} {
		queued := rawRequest(t, base, fmt.Sprintf(`{"model":"llama-3-8b","prompt":"second","max_tokens":5,"stream":%t}`, stream))
		waitUntil(t, "the second request is queued", func() bool { return s.Stats().Waiting == 1 })
		queued.Close()
		waitUntil(t, "the queued request leaves the queue", func() bool { return s.Stats().Waiting == 0 })
		if st := s.Stats(); st.Running != 1 || st.PromptTokens != admitted {
			t.Fatalf("after the queued client left: %+v", st)
		}
	}
	first.Close()
	waitUntil(t, "the first request is aborted too", func() bool { return idle(s) })
}
