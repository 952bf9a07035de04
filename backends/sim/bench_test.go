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
