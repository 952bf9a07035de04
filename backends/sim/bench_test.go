package sim

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkStream256 is how many streamed tokens a second the simulator
// delivers to 256 concurrent SSE clients over loopback HTTP when the engine
// itself is free (TimeScale 0): the ceiling a load test can measure through
// it. One op is one token received by a client; the clients run on the same
// cores and are counted in the cost.
//
//	go test -run XXX -bench Stream256 -benchtime 2000000x ./backends/sim
func BenchmarkStream256(b *testing.B) {
	const streams, perRequest = 256, 512
	_, base := startServer(b, Config{})
	tr := &http.Transport{MaxIdleConnsPerHost: streams, MaxConnsPerHost: streams, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body := `{"model":"llama-3-8b","prompt":"benchmark","max_tokens":512,"stream":true}`
	requests := int64((b.N + perRequest - 1) / perRequest)
	var next, received atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range streams {
		wg.Go(func() {
			for next.Add(1) <= requests {
				resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				sc := bufio.NewScanner(resp.Body)
				n := int64(0)
				for sc.Scan() {
					if bytes.HasPrefix(sc.Bytes(), []byte(`data: {`)) {
						n++
					}
				}
				resp.Body.Close()
				if n != perRequest {
					b.Errorf("stream of %d tokens, want %d (%v)", n, perRequest, sc.Err())
					return
				}
				received.Add(n)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(received.Load())/elapsed.Seconds(), "tokens/s")
}

// BenchmarkEngineStep is one engine step (plan and commit, no sleeping) of
// a steady batch: requests that share a 512-token system prompt, each with
// its own 64-token question and 128 tokens of output, kept at about 64
// running. New requests are made in the loop, as the server makes them, and
// are counted. With the cache on, each step also hashes every token
// generated and admissions look their blocks up; with it off, the engine is
// the one before the cache.
//
//	go test -run XXX -bench EngineStep -benchmem ./backends/sim
func BenchmarkEngineStep(b *testing.B) {
	for _, tc := range []struct {
		name string
		off  bool
	}{{"cache=on", false}, {"cache=off", true}} {
		b.Run(tc.name, func(b *testing.B) {
			c := Config{DisablePrefixCaching: tc.off}
			s := testSettings(b, c)
			clk := &manualClock{t: time.Unix(1_700_000_000, 0)}
			e := newEngine(s, clk.now, engineHooks{})
			// Prompts are hashed once, outside the loop: parsing is the
			// server's cost, not the step's.
			const prompts = 256
			hashed := make([]blockHasher, prompts)
			for i := range hashed {
				h := newBlockHasher(s.blockSize, nil, 36)
				for j := range 512 + 64 {
					id := j
					if j >= 512 {
						id = int(mix(uint64(i)<<32|uint64(j)) % plainVocab)
					}
					h.add(id)
				}
				hashed[i] = h
			}
			next := 0
			refill := func() {
				for len(e.waiting)+len(e.running) < 72 {
					r := req(512+64, 128, 1)
					r.seqs[0].key = uint64(next)
					if !tc.off {
						r.cacheAs(&hashed[next%prompts], 128)
					}
					next++
					if err := e.submit(r); err != nil {
						b.Fatal(err)
					}
				}
			}
			refill()
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := e.step(); !ok {
					b.Fatal("idle")
				}
				refill()
			}
			st := e.stats()
			b.ReportMetric(float64(st.PeakUsedBlocks), "peak-blocks")
			if st.PrefixCacheQueries > 0 {
				b.ReportMetric(float64(st.PrefixCacheHits)/float64(st.PrefixCacheQueries), "hit-ratio")
			}
		})
	}
}
