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

// call is one request as a client sends it.
type call struct {
	api    api
	path   string
	stream bool
	body   []byte
	key    string
}

// newCall draws a request: its route, streamed or not, its prompt and
// output lengths, its tenant (and now and then a wrong key).
func newCall(rng *rand.Rand) call {
	prompt := func() string {
		w := strings.Fields(words)
		n := 5 + rng.IntN(400)
		if rng.IntN(8) == 0 {
			n = 800 + rng.IntN(1200) // a long prompt: the budget fills
		}
		var b strings.Builder
		for range n {
			b.WriteString(" " + w[rng.IntN(len(w))])
		}
		return b.String()
	}
	maxTokens := 1 + rng.IntN(128)
	if rng.IntN(10) == 0 {
		maxTokens = 128 + rng.IntN(897)
	}
	c := call{stream: rng.IntN(2) == 0}
	body := map[string]any{"model": "llama-3-8b"}
	switch r := rng.IntN(100); {
	case r < 25:
		c.api, c.path = apiChat, "/v1/chat/completions"
		body["messages"] = []map[string]string{{"role": "user", "content": prompt()}}
	case r < 42:
		c.api, c.path = apiCompletions, "/v1/completions"
		body["prompt"] = prompt()
	case r < 62:
		c.api, c.path = apiResponses, "/v1/responses"
	case r < 82:
		c.api, c.path = apiMessages, "/v1/messages"
	case r < 92:
		c.api, c.path, c.stream = apiEmbeddings, "/v1/embeddings", false
	default:
		c.api, c.path, c.stream = apiRerank, "/rerank", false
	}
	switch c.api {
	case apiChat, apiCompletions:
		body["max_tokens"], body["stream"] = maxTokens, c.stream
		if rng.IntN(10) == 0 {
			body["n"] = 2 + rng.IntN(2)
		}
		if c.stream && rng.IntN(2) == 0 {
			body["stream_options"] = map[string]bool{"include_usage": true}
		}
	case apiResponses:
		body["max_output_tokens"], body["stream"] = maxTokens, c.stream
		if rng.IntN(2) == 0 {
			body["input"] = prompt()
		} else {
			body["instructions"] = "answer briefly"
			body["input"] = []map[string]any{{"role": "user", "content": []map[string]string{{"type": "input_text", "text": prompt()}}}}
		}
	case apiMessages:
		body["max_tokens"], body["stream"] = maxTokens, c.stream
		body["system"] = "answer briefly"
		body["messages"] = []map[string]string{{"role": "user", "content": prompt()}}
	case apiEmbeddings:
		if rng.IntN(2) == 0 {
			body["input"] = prompt()
		} else {
			body["input"] = []string{prompt(), prompt()}
		}
	case apiRerank:
		body["query"] = prompt()
		body["documents"] = []string{prompt(), prompt(), prompt()}
	}
	c.body, _ = json.Marshal(body)
	c.key = []string{"key-alpha", "key-beta"}[rng.IntN(2)]
	if rng.IntN(100) == 0 {
		c.key = "key-wrong"
	}
	return c
}

// pick draws a replica among those in the clients' rotation.
func (s *soak) pick(rng *rand.Rand) *replica {
	for {
		r := s.replicas[rng.IntN(len(s.replicas))]
		if !r.down.Load() {
			return r
		}
	}
}

// one sends one random request to a replica and tallies what came back.
func (s *soak) one(ctx context.Context, rng *rand.Rand) {
	c := newCall(rng)
	r := s.pick(rng)
	draw := rng.Float64()
	if draw < s.o.halfCloseRate {
		v, err := halfClose(r.addr, c)
		s.tally.add(c.api.String(), r.name, true, v, false, err)
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if draw < s.o.halfCloseRate+s.o.cancelRate {
		t := time.AfterFunc(time.Duration(rng.IntN(100_000))*time.Microsecond, cancel)
		defer t.Stop()
	}
	req, _ := http.NewRequestWithContext(rctx, "POST", r.url+c.path, strings.NewReader(string(c.body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.key)
	if c.api == apiMessages {
		req.Header.Set("Anthropic-Version", "2023-06-01")
	}
	// An error is our own hang-up when this request's context ended and
	// the run's did not; anything else is a transport error.
	failed := func(err error) {
		hungUp := rctx.Err() != nil && ctx.Err() == nil
		s.tally.add(c.api.String(), r.name, false, verdict{}, hungUp, err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		failed(err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		failed(err)
		return
	}
	s.tally.add(c.api.String(), r.name, false, judge(c.api, c.stream, resp.StatusCode, data), false, nil)
}
