package main

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// load sends requests [from, to) from the clients; event runs (in one
// client) as request i is sent.
func (s *soak) load(ctx context.Context, from, to int, event func(i int)) error {
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	for w := range s.o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(s.o.Seed, uint64(w)))
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				if event != nil {
					event(i)
				}
				s.one(ctx, rng)
			}
		}()
	}
	wg.Wait()
	return ctx.Err()
}

const words = " the of KV cache block token budget gateway request stream prompt output memory"

// one sends one random request and tallies what came back.
func (s *soak) one(ctx context.Context, rng *rand.Rand) {
	s.sent.Add(1)
	chat := rng.IntN(2) == 0
	stream := rng.IntN(2) == 0
	n := 1
	if rng.IntN(10) == 0 {
		n = 2 + rng.IntN(2)
	}
	var prompt strings.Builder
	for range 5 + rng.IntN(400) {
		w := strings.Fields(words)
		prompt.WriteString(" " + w[rng.IntN(len(w))])
	}
	body := map[string]any{"model": "llama-3-8b", "max_tokens": 1 + rng.IntN(128), "stream": stream, "n": n}
	path := "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
		body["messages"] = []map[string]string{{"role": "user", "content": prompt.String()}}
	} else {
		body["prompt"] = prompt.String()
	}
	if stream && rng.IntN(2) == 0 {
		body["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(body)
	key := []string{"key-alpha", "key-beta"}[rng.IntN(2)]
	if rng.IntN(100) == 0 {
		key = "key-wrong"
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cancels := rng.Float64() < s.o.cancelRate
	if cancels {
		t := time.AfterFunc(time.Duration(rng.IntN(30_000))*time.Microsecond, cancel)
		defer t.Stop()
	}
	req, _ := http.NewRequestWithContext(rctx, "POST", s.gwURL+path, strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	// An error is our own hang-up when this request's context ended and
	// the run's did not; anything else is a transport error.
	failed := func() {
		if rctx.Err() != nil && ctx.Err() == nil {
			s.canceled.Add(1)
		} else {
			s.netErrs.Add(1)
		}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		failed()
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		failed()
		return
	}
	c, _ := s.codes.LoadOrStore(resp.StatusCode, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
	if resp.StatusCode == 200 && stream && !strings.HasSuffix(string(data), "data: [DONE]\n\n") {
		s.broken.Add(1)
	}
}
