package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// drive runs the clients and the monitor for the scenario's time.
func drive(ctx context.Context, o options, sc *scenario, url, simURL string, res *result) error {
	ctx, cancel := context.WithTimeout(ctx, res.total)
	defer cancel()
	start := time.Now()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.clients * 2, MaxConnsPerHost: o.clients * 2}}
	var mu sync.Mutex
	hangup := make(chan struct{})
	var wg sync.WaitGroup
	for c := range o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(o.Seed, uint64(c)))
			if sc.joinsLate != nil && sc.joinsLate(c) {
				select {
				case <-time.After(o.shiftAt):
				case <-ctx.Done():
					return
				}
			}
			for seq := 0; ctx.Err() == nil; seq++ {
				rec := send(ctx, client, url, sc, c, seq, time.Since(start), rnd, hangup)
				rec.end = time.Since(start)
				if ctx.Err() != nil && rec.outcome != ok {
					return // cut by the end of the run: not counted
				}
				mu.Lock()
				res.records = append(res.records, rec)
				mu.Unlock()
			}
		}()
	}
	if sc.hangupAt > 0 {
		go func() {
			select {
			case <-time.After(sc.hangupAt):
				close(hangup)
			case <-ctx.Done():
			}
		}()
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
		s := sample{at: time.Since(start)}
		if m, err := benchkit.Scrape(ctx, http.DefaultClient, simURL+"/metrics"); err == nil {
			s.kv = m.Sum("vllm:kv_cache_usage_perc")
		}
		if st, err := status(ctx, url); err == nil && len(st.Queues) > 0 && len(st.GPUs) > 0 {
			s.p90, s.distrusted = st.Queues[0].P90, st.Queues[0].Distrusted
			s.overcommit = float64(st.GPUs[0].Held) / math.Max(1, float64(st.GPUs[0].Capacity))
			s.trips, s.driftTrips = st.Admission.Trips, st.Admission.DriftTrips
		}
		res.samples = append(res.samples, s)
	}
	wg.Wait()
	end, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if st, err := status(end, url); err == nil {
		res.guardStops = st.Admission.GuardStops
	}
	if m, err := benchkit.Scrape(end, http.DefaultClient, url+"/metrics"); err == nil {
		res.resumed = m.Sum("kvgate_streams_resumed_total")
	}
	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(res.records, func(a, b record) int { return int(a.start - b.start) })
	return nil
}

type statusView struct {
	Admission struct {
		GuardStops int64            `json:"guard_stops"`
		Trips      map[string]int64 `json:"forecast_trips"`
		DriftTrips map[string]int64 `json:"drift_trips"`
	} `json:"admission"`
	GPUs []struct {
		Held      int64 `json:"held_bytes"`
		Capacity  int64 `json:"capacity_bytes"`
		Committed int64 `json:"committed_bytes"`
	} `json:"gpus"`
	Queues []struct {
		P90        int  `json:"p90_output_tokens"`
		Distrusted bool `json:"distrusted"`
	} `json:"queues"`
}

func status(ctx context.Context, url string) (statusView, error) {
	var v statusView
	err := benchkit.Status(ctx, http.DefaultClient, url, &v)
	return v, err
}

// prompt is about 340 tokens of the simulator's tokenizer (four bytes a
// token), unique per request so that each draws its own length.
func prompt(c, seq int, long bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "client %d request %d. ", c, seq)
	if long {
		b.WriteString(longMarker + " ")
	}
	for b.Len() < 1360 {
		b.WriteString("the quick brown fox jumps over the lazy dog ")
	}
	return b.String()
}

func send(ctx context.Context, client *http.Client, url string, sc *scenario, c, seq int, at time.Duration, rnd *rand.Rand, hangup <-chan struct{}) record {
	rec := record{start: at}
	if sc.tenantOf != nil {
		rec.tenant = sc.tenantOf(c)
	}
	rec.long = sc.long != nil && sc.long(c, at, rnd)
	stream := sc.noStream == nil || !sc.noStream(c, rnd)
	maxTok := maxTokens
	if sc.maxTokens != nil {
		maxTok = sc.maxTokens(c)
	}
	body := map[string]any{"model": model, "max_tokens": maxTok, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": prompt(c, seq, rec.long)}}}
	if sc.minTokens != nil {
		if m := sc.minTokens(c, rnd); m > 0 {
			body["min_tokens"], rec.long = m, true
		}
	}
	if stream {
		body["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(body)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if sc.hangupAt > 0 && c < sc.hangups {
		select {
		case <-hangup: // hung up once already
		default:
			go func() {
				select {
				case <-hangup:
					cancel()
				case <-rctx.Done():
				}
			}()
		}
	}
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if rec.tenant != "" {
		req.Header.Set("Authorization", "Bearer key-"+rec.tenant)
	}
	sent := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return classifyErr(rec, rctx, ctx, err)
	}
	defer resp.Body.Close()
	rec.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		rec.outcome, rec.detail = classifyError(resp.StatusCode, data)
		return rec
	}
	if !stream {
		var v struct {
			Usage struct {
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
		}
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return classifyErr(rec, rctx, ctx, err)
		}
		if err := json.Unmarshal(data, &v); err != nil {
			rec.outcome, rec.detail = other, "bad JSON"
			return rec
		}
		rec.outcome, rec.tokens = ok, v.Usage.Completion
		return rec
	}
	sc2 := bufio.NewScanner(resp.Body)
	sc2.Buffer(make([]byte, 64<<10), 1<<20)
	done := false
	for sc2.Scan() {
		line := sc2.Bytes()
		data, found := bytes.CutPrefix(line, []byte("data: "))
		if !found {
			continue
		}
		if string(data) == "[DONE]" {
			done = true
			break
		}
		if rec.ttft == 0 && bytes.Contains(data, []byte(`"content"`)) {
			rec.ttft = time.Since(sent)
		}
		if bytes.Contains(data, []byte(`"error"`)) {
			rec.outcome, rec.detail = classifyError(200, data)
			return rec
		}
		if bytes.Contains(data, []byte(`"usage"`)) && !bytes.Contains(data, []byte(`"usage":null`)) {
			var v struct {
				Usage struct {
					Completion int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if json.Unmarshal(data, &v) == nil && v.Usage.Completion > 0 {
				rec.tokens = v.Usage.Completion
			}
		}
	}
	if !done {
		return classifyErr(rec, rctx, ctx, sc2.Err())
	}
	rec.outcome = ok
	return rec
}

func classifyErr(rec record, rctx, ctx context.Context, err error) record {
	if rctx.Err() != nil && ctx.Err() == nil {
		rec.outcome = canceled
		return rec
	}
	rec.outcome, rec.detail = other, fmt.Sprint(err)
	return rec
}

func classifyError(status int, data []byte) (outcome, string) {
	switch {
	case bytes.Contains(data, []byte("kv_guard_stopped")):
		return stopped, ""
	case bytes.Contains(data, []byte("out of memory")):
		return oom, ""
	case status == http.StatusTooManyRequests:
		return shed, ""
	}
	d := string(data)
	if len(d) > 200 {
		d = d[:200]
	}
	return other, fmt.Sprintf("%d %s", status, d)
}
