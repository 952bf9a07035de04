package gateway

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/backends/sim"
)

// The gateway's cost, measured side by side with the backend alone in one
// run: the simulator's engine is free (TimeScale 0), so what is left is
// HTTP, parsing, tokenizing, admission and relaying.
//
//	go test -run XXX -bench 'Gateway' -benchtime 3000x ./gateway

func benchTargets(b *testing.B) (direct, gw string) {
	_, simURL := startSim(b, func(c *sim.Config) { c.TimeScale = 0 })
	cfg := baseConfig(simURL, "")
	_, gwURL := startGateway(b, cfg, Options{})
	return simURL, gwURL
}

var benchClient = &fasthttp.Client{MaxConnsPerHost: 1024, ReadTimeout: 30 * time.Second}

func doRequest(b *testing.B, url, body string) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url + "/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.SetBodyString(body)
	if err := benchClient.Do(req, resp); err != nil || resp.StatusCode() != 200 {
		b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

// BenchmarkGatewayLatency alternates one request straight to the backend
// and one through the gateway, so noise lands on both alike, and reports
// the added latency at p50 and p99 for small requests, streamed and not.
func BenchmarkGatewayLatency(b *testing.B) {
	direct, gw := benchTargets(b)
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) {
			body := chatBody("What is a KV cache? Answer in one line.", 16, stream)
			for range 50 { // warm connections and the drain estimate
				doRequest(b, direct, body)
				doRequest(b, gw, body)
			}
			var dl, gl []time.Duration
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				doRequest(b, direct, body)
				t1 := time.Now()
				doRequest(b, gw, body)
				t2 := time.Now()
				dl, gl = append(dl, t1.Sub(t0)), append(gl, t2.Sub(t1))
			}
			d50, d99, g50, g99 := percentile(dl, .5), percentile(dl, .99), percentile(gl, .5), percentile(gl, .99)
			b.ReportMetric(float64(d50.Microseconds()), "direct-p50-µs")
			b.ReportMetric(float64(g50.Microseconds()), "gateway-p50-µs")
			b.ReportMetric(float64((g50 - d50).Microseconds()), "added-p50-µs")
			b.ReportMetric(float64((g99 - d99).Microseconds()), "added-p99-µs")
		})
	}
}

// BenchmarkGatewayThroughput drives 64 concurrent clients at each target
// in turn; compare the req/s of the direct and gateway sub-benchmarks of one
// run. With the engine free, all three processes' HTTP work competes for the
// same cores and the gateway's three exchanges per request (client,
// /tokenize, completion) against the backend's one set the ratio; with the
// engine at a tenth of real GPU time, the engine is the bottleneck, as it is
// in production.
func BenchmarkGatewayThroughput(b *testing.B) {
	for _, v := range []struct {
		scale     float64
		tokenizer string
	}{{0, "backend"}, {0, "estimate"}, {0.1, "backend"}} {
		_, simURL := startSim(b, func(c *sim.Config) { c.TimeScale = v.scale })
		cfg := strings.Replace(baseConfig(simURL, ""), "tokenizer: backend", "tokenizer: "+v.tokenizer, 1)
		_, gw := startGateway(b, cfg, Options{})
		body := chatBody("What is a KV cache? Answer in one line.", 16, false)
		for _, tgt := range []struct{ name, url string }{{"direct", simURL}, {"gateway", gw}} {
			b.Run(fmt.Sprintf("timescale=%g/tokenizer=%s/%s", v.scale, v.tokenizer, tgt.name), func(b *testing.B) {
				b.SetParallelism(32) // × GOMAXPROCS goroutines
				var n atomic.Int64
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						doRequest(b, tgt.url, body)
						n.Add(1)
					}
				})
				b.ReportMetric(float64(n.Load())/time.Since(start).Seconds(), "req/s")
			})
		}
	}
}
