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
			s.kv, s.kvKnown = m.Sum("vllm:kv_cache_usage_perc"), true
		}
		if st, err := status(ctx, url); err == nil && len(st.Queues) > 0 && len(st.GPUs) > 0 {
			s.p90, s.distrusted = st.Queues[0].P90, st.Queues[0].Distrusted
			s.overcommit = float64(st.GPUs[0].Held) / math.Max(1, float64(st.GPUs[0].Capacity))
			s.trips, s.driftTrips = st.Admission.Trips, st.Admission.DriftTrips
		}
		res.samples = append(res.samples, s)
		if sc.dense != nil && res.calibratedAt == 0 && s.at >= o.shiftAt {
			if m, err := benchkit.Scrape(ctx, http.DefaultClient, url+"/metrics"); err == nil {
				res.calibratedAt, res.promptsAt = s.at, promptCounts(m)
			}
		}
	}
	wg.Wait()
	end, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if st, err := status(end, url); err == nil {
		res.guardStops = st.Admission.GuardStops
	}
	if m, err := benchkit.Scrape(end, http.DefaultClient, url+"/metrics"); err == nil {
		res.resumed = m.Sum("kvgate_streams_resumed_total")
		res.preemptive = m.Sum("kvgate_admission_preemptive_total")
		res.promptsEnd = promptCounts(m)
		const ratio = "kvgate_prompt_tokens_actual_over_predicted"
		res.prompts = m.Sum(ratio+"_count", `tokenizer="estimate"`)
		res.underCounted = res.prompts - m.Sum(ratio+"_bucket", `tokenizer="estimate"`, `le="1"`)
		res.widened = m.Sum("kvgate_prompt_estimate_widened_total")
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

// promptCounts reads the prompt tokens the gateway predicted and the
// backends reported, by tenant: [0] predicted, [1] actual.
func promptCounts(m benchkit.Metrics) map[string][2]float64 {
	out := map[string][2]float64{}
	for _, t := range []string{"en", "dense"} {
		out[t] = [2]float64{m.Sum("kvgate_tokens_predicted_total", `kind="prompt"`, `tenant="`+t+`"`), m.Sum("kvgate_tokens_actual_total", `kind="prompt"`, `tenant="`+t+`"`)}
	}
	return out
}

// densePrompt is about 2400 bytes dense in tokens (1000–1600 of the
// simulator's), unique per request: code, JSON with digits, CJK text and
// emoji in turn.
func densePrompt(c, seq int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "client %d request %d.\n", c, seq)
	parts := []string{
		"func (s *Server) route(ctx *fasthttp.RequestCtx) { if x[i] != nil && y <= 0x1f { return s.h(ctx, i+1) } }\n",
		`{"id":1234567,"price":[19.99,4.5e-3],"ok":true,"tags":["a1","b2"],"at":"2025-06-20T01:38:43Z"},` + "\n",
		"日本語のテキストは英語より多くのトークンを使います。请用中文回答这个问题，谢谢。\n",
		"🎉🚀😀👍🔥🤖📈🧪 ✅❌⚡️💡\n",
	}
	for i := seq; b.Len() < 2400; i++ {
		b.WriteString(parts[i%len(parts)])
	}
	return b.String()
}

// The request of each route, the path and the body, and how its answer
// says how many tokens it generated.
var routes = [...]string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"}

// weatherTool is a function tool in the form of route i.
func weatherTool(i int) map[string]any {
	params := map[string]any{"type": "object", "properties": map[string]any{
		"city": map[string]any{"type": "string", "description": "the city, e.g. Paris"},
		"unit": map[string]any{"type": "string", "enum": []string{"celsius", "fahrenheit"}}}, "required": []string{"city"}}
	switch i {
	case 2:
		return map[string]any{"type": "function", "name": "get_weather", "description": "Current weather of a city", "parameters": params}
	case 3:
		return map[string]any{"name": "get_weather", "description": "Current weather of a city", "input_schema": params}
	}
	return map[string]any{"type": "function", "function": map[string]any{"name": "get_weather", "description": "Current weather of a city", "parameters": params}}
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
	text := prompt(c, seq, rec.long)
	if sc.dense != nil && sc.dense(c) {
		text = densePrompt(c, seq)
	}
	path, route := "/v1/chat/completions", 0
	if sc.routes {
		route = (c + seq) % len(routes)
		path = routes[route]
	}
	body := map[string]any{"model": model, "max_tokens": maxTok, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": text}}}
	switch route {
	case 1:
		delete(body, "messages")
		body["prompt"] = text
	case 2, 3:
		// Their streams end without [DONE]: these are read whole.
		stream = false
		body["stream"] = false
		if route == 2 {
			delete(body, "messages")
			delete(body, "max_tokens")
			body["input"], body["max_output_tokens"] = text, maxTok
		}
	}
	if sc.routes && route != 1 {
		body["tools"] = []any{weatherTool(route)}
	}
	switch {
	case sc.responses:
		body = map[string]any{"model": model, "max_output_tokens": maxTok, "stream": stream, "input": text}
		path = "/v1/responses"
	case sc.jsonObject:
		body["response_format"] = map[string]string{"type": "json_object"}
	}
	if sc.minTokens != nil {
		if m := sc.minTokens(c, rnd); m > 0 {
			body["min_tokens"], rec.long = m, true
		}
	}
	if stream && !sc.responses {
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
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, url+path, bytes.NewReader(b))
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
				Output     int `json:"output_tokens"` // Responses, Messages
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
		rec.outcome, rec.tokens = ok, v.Usage.Completion+v.Usage.Output
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
		// A Responses event's response carries "error":null: its errors
		// are told by their type.
		failed := bytes.Contains(data, []byte(`"error"`))
		if sc.responses {
			failed = bytes.Contains(data, []byte(`"type":"error"`)) || bytes.Contains(data, []byte(`"type":"response.failed"`))
		}
		if failed {
			rec.outcome, rec.detail = classifyError(200, data)
			return rec
		}
		if sc.responses && (bytes.Contains(data, []byte(`"type":"response.completed"`)) || bytes.Contains(data, []byte(`"type":"response.incomplete"`))) {
			var v struct {
				Response struct {
					Usage struct {
						Output int `json:"output_tokens"`
					} `json:"usage"`
				} `json:"response"`
			}
			if json.Unmarshal(data, &v) == nil {
				rec.tokens = v.Response.Usage.Output
			}
			done = true
			break
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
