package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"
)

// latency alternates small requests between two targets from two clients
// and returns each target's latencies (non-streamed, 4 output tokens).
func (b *bench) latency(targets [2]string, n int) ([2][]time.Duration, error) {
	var out [2][]time.Duration
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for c := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 11))
			for k := range n {
				i := (k + c) % 2
				body, _ := json.Marshal(map[string]any{"model": "llama-3-8b", "max_tokens": 4,
					"messages": []map[string]string{{"role": "user", "content": "hello" + strconv.Itoa(rng.IntN(1<<20))}}})
				start := time.Now()
				status, text, _, err := post(context.Background(), targets[i], bulkKey, string(body))
				took := time.Since(start)
				mu.Lock()
				if err == nil && status != 200 {
					err = fmt.Errorf("%s: status %d: %.200s", targets[i], status, text)
				}
				if err != nil && firstErr == nil {
					firstErr = err
				}
				out[i] = append(out[i], took)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out, firstErr
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
