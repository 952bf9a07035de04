package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// load is a closed loop of clients sending to targets round robin,
// skipping a target that refuses connections (a load balancer's health
// check, in one line).
type load struct {
	targets []string
	dead    []atomic.Bool
	stopped atomic.Bool
	wg      sync.WaitGroup
	ok      []atomic.Int64 // per target
	shed    atomic.Int64
	failed  atomic.Int64
	oom     atomic.Int64
	cancel  context.CancelFunc

	// While record is set, each answer's latency is kept per target.
	record atomic.Bool
	latMu  sync.Mutex
	lat    [][]time.Duration // per target; under latMu
}

// recorded stops recording and returns the latencies kept, per target.
func (l *load) recorded() [][]time.Duration {
	l.record.Store(false)
	l.latMu.Lock()
	defer l.latMu.Unlock()
	out := l.lat
	l.lat = make([][]time.Duration, len(l.targets))
	return out
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0}}

func (b *bench) startLoad(targets []string, clients int) *load {
	return b.startLoadAs(targets, clients, tenantLoad{key: bulkKey, prompt: b.o.promptTokens, maxTokens: b.o.maxTokens})
}

// tenantLoad is whose requests a load sends (its API key) and their size.
type tenantLoad struct {
	key               string
	prompt, maxTokens int
}

func (b *bench) startLoadAs(targets []string, clients int, t tenantLoad) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{targets: targets, dead: make([]atomic.Bool, len(targets)), ok: make([]atomic.Int64, len(targets)), cancel: cancel,
		lat: make([][]time.Duration, len(targets))}
	for c := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for n := c; !l.stopped.Load(); n++ {
				i := n % len(targets)
				for l.dead[i].Load() {
					n++
					i = n % len(targets)
				}
				body := chatBody(rng, t.prompt, t.maxTokens)
				sent := time.Now()
				status, text, retry, err := post(ctx, targets[i], t.key, body)
				if status == 200 && l.record.Load() {
					l.latMu.Lock()
					l.lat[i] = append(l.lat[i], time.Since(sent))
					l.latMu.Unlock()
				}
				switch {
				case l.stopped.Load():
					return
				case err != nil:
					var op *net.OpError
					if errors.As(err, &op) && op.Op == "dial" {
						l.dead[i].Store(true)
					}
					l.failed.Add(1)
				case strings.Contains(text, "CUDA out of memory"):
					l.oom.Add(1)
				case status == 200:
					l.ok[i].Add(1)
				case status == 429:
					l.shed.Add(1)
					time.Sleep(min(retry, 2*time.Second))
				default:
					l.failed.Add(1)
				}
			}
		}()
	}
	return l
}

func (l *load) halt() {
	l.stopped.Store(true)
	l.cancel()
	l.wg.Wait()
}

func (l *load) served() int64 {
	var n int64
	for i := range l.ok {
		n += l.ok[i].Load()
	}
	return n
}

func (l *load) counts() (ok, shed, failed, oom int64) {
	return l.served(), l.shed.Load(), l.failed.Load(), l.oom.Load()
}

// chatBody is a streamed chat request of about prompt tokens (the
// simulator counts " w123" as two) and max_tokens, its words random so
// that the simulator draws each request's output length afresh.
func chatBody(rng *rand.Rand, prompt, maxTokens int) string {
	var sb strings.Builder
	for range prompt / 2 {
		sb.WriteString(" w")
		sb.WriteString(strconv.Itoa(rng.IntN(1000)))
	}
	b, _ := json.Marshal(map[string]any{
		"model": "llama-3-8b", "max_tokens": maxTokens, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": sb.String()}},
	})
	return string(b)
}

// post sends body as the tenant whose API key is key.
func post(ctx context.Context, url, key, body string) (status int, text string, retry time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if s, e := strconv.Atoi(resp.Header.Get("Retry-After")); e == nil {
		retry = time.Duration(s) * time.Second
	}
	return resp.StatusCode, string(data), retry, err
}
