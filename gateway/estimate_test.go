package gateway

import (
	"fmt"

	"encoding/json"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/backends/sim"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode"
)

var vocabulary = strings.Fields(`the quick brown fox jumps over a lazy dog while seventeen engineers
measure throughput latency memory budgets tokenizer calibration gateway admission
international representatives of extraordinarily complicated infrastructure`)

func sentence(r *rand.Rand, words int) string {
	var b strings.Builder
	for i := range words {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[r.IntN(len(vocabulary))])
	}
	return b.String()
}

// The estimate starts at the byte bound, far above the backend's count
// of English, never below it, and calibration on the usage answers report
// brings it within 15 % above the real count, never below.
func TestEstimateCalibratesTowardBackend(t *testing.T) {
	_, url := startSim(t, nil)
	cfg := strings.Replace(baseConfig(url, ""), "tokenizer: backend", "tokenizer: estimate\n    estimate: {calibration_min: 16}", 1)
	gw, gwURL := startGateway(t, cfg, Options{})
	m := gw.rt.Load().models["llama-3-8b"]
	r := rand.New(rand.NewPCG(1, 2))

	// over is how far above the backend's own count (its /tokenize, the
	// exact answer) the estimate is on a fresh prompt.
	over := func() float64 {
		text := sentence(r, 100+r.IntN(300))
		body, _ := json.Marshal(map[string]any{"model": "llama-3-8b", "messages": []map[string]string{{"role": "user", "content": text}}})
		res := postJSON(url, "/tokenize", string(body))
		var tk struct{ Count int }
		if err := json.Unmarshal([]byte(res.body), &tk); err != nil || tk.Count == 0 {
			t.Fatalf("tokenize: %s", res.body)
		}
		s := textShape([]byte(text))
		s.messages = 1
		return float64(m.est.predict(s)-tk.Count) / float64(tk.Count)
	}
	before := over()
	for range 20 {
		if res := postJSON(gwURL, "/v1/chat/completions", chatBody(sentence(r, 50+r.IntN(400)), 2, false)); res.status != 200 {
			t.Fatalf("%d %s", res.status, res.body)
		}
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for range 20 {
		e := over()
		lo, hi = min(lo, e), max(hi, e)
	}
	st := m.est.state()
	t.Logf("over before calibration %+.0f%%, after %+.1f%% to %+.1f%%; %+v", 100*before, 100*lo, 100*hi, st)
	if before < 2 {
		t.Errorf("the bound is only %+.0f%% over English: is it a bound?", 100*before)
	}
	if !st.Calibrated || lo < 0 || hi > 0.15 {
		t.Errorf("after calibration the estimate is %+.1f%% to %+.1f%% off the real count (calibrated %v)", 100*lo, 100*hi, st.Calibrated)
	}
}

// Review finding: an estimate (which errs high on purpose) turned requests
// that fit into 400 context_length_exceeded. Only exact counts may refuse;
// an estimate that says "too long" reserves the whole context instead.
func TestEstimateNeverRefusesWhatFits(t *testing.T) {
	_, url := startSim(t, nil)
	cfg := strings.Replace(baseConfig(url, ""), "tokenizer: backend", "tokenizer: estimate", 1)
	gw, gwURL := startGateway(t, cfg, Options{})
	// 7000 sim tokens (" abc" each); estimated 7000 × 1.1 + overhead > 8192 − 1000.
	r := postJSON(gwURL, "/v1/chat/completions", chatBody(words(7000), 1000, false))
	if r.status != 200 {
		t.Fatalf("a request that fits got %d: %.300s", r.status, r.body)
	}
	eventually(t, "the reservation to return", func() bool { return held(gw) == 0 })
	// With the backend's exact count, one that does not fit is still refused.
	_, gwExact := startGateway(t, baseConfig(url, ""), Options{})
	if r := postJSON(gwExact, "/v1/chat/completions", chatBody(words(7500), 1000, false)); r.status != 400 || !strings.Contains(r.body, "context_length_exceeded") {
		t.Fatalf("exact count over the context: %d %.300s", r.status, r.body)
	}
}

// Review finding: default_max_tokens was reserved but not sent, so the
// backend generated to the end of the context. The gateway now sends it.
func TestDefaultMaxTokensIsSent(t *testing.T) {
	_, url := startSim(t, nil)
	cfg := strings.Replace(baseConfig(url, ""), "max_model_len: 8192", "max_model_len: 8192\n    default_max_tokens: 16", 1)
	gw, gwURL := startGateway(t, cfg, Options{})
	body := `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}]}`
	r := postJSON(gwURL, "/v1/chat/completions", body)
	var resp struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(r.body), &resp); err != nil || r.status != 200 || resp.Usage.CompletionTokens != 16 {
		t.Fatalf("%d %v: %.300s", r.status, err, r.body)
	}
	// Streamed too, where the body also gains include_usage.
	r = postJSON(gwURL, "/v1/chat/completions", strings.Replace(body, `"model"`, `"stream":true,"model"`, 1))
	if n := strings.Count(r.body, `"delta":{"content":`); r.status != 200 || n != 16 {
		t.Fatalf("streamed: %d, %d tokens: %.300s", r.status, n, r.body)
	}
	eventually(t, "the reservation to return", func() bool { return held(gw) == 0 })
}

// randomText draws text of every density: English words, digits, code and
// JSON punctuation, two-, three- and four-byte runes, spaces and line breaks.
func randomText(r *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		switch r.IntN(7) {
		case 0:
			b.WriteString(vocabulary[r.IntN(len(vocabulary))])
		case 1:
			b.WriteString(fmt.Sprint(r.Int64()))
		case 2:
			const punct = `{}[]():;,."'=<>!&|*-+/\_%#@`
			b.WriteByte(punct[r.IntN(len(punct))])
		case 3:
			b.WriteRune(rune(0x80 + r.IntN(0x800-0x80)))
		case 4:
			b.WriteRune(rune(0x3040 + r.IntN(0x9FFF-0x3040)))
		case 5:
			b.WriteRune(rune(0x1F300 + r.IntN(0x1FAFF-0x1F300)))
		default:
			b.WriteString([]string{" ", "  ", "\n", "\n    ", "\t", "\r\n"}[r.IntN(6)])
		}
	}
	// fastjson writes a rune that is not printable as \U0001f8fd, which
	// JSON does not have: a body re-marshalled from its tree keeps to
	// printable runes.
	return strings.Map(func(r rune) rune {
		if r >= 0x80 && !unicode.IsPrint(r) {
			return -1
		}
		return r
	}, b.String())
}

// randomTool is a function tool with a nested schema of random text, in
// the form of the route (chat, Responses or Messages).
func randomTool(r *rand.Rand, kind endpoint) map[string]any {
	schema := map[string]any{"type": "object", "properties": map[string]any{}}
	props := schema["properties"].(map[string]any)
	for range 1 + r.IntN(4) {
		p := map[string]any{"type": "string", "description": randomText(r, r.IntN(40))}
		if r.IntN(2) == 0 {
			p = map[string]any{"type": "array", "items": map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"enum": []any{1, 2, randomText(r, 5)}}}}}
		}
		props[randomText(r, 1+r.IntN(8))] = p
	}
	name, desc := randomText(r, 1+r.IntN(12)), randomText(r, r.IntN(80))
	switch kind {
	case messagesAPI:
		return map[string]any{"name": name, "description": desc, "input_schema": schema}
	case responsesAPI:
		return map[string]any{"type": "function", "name": name, "description": desc, "parameters": schema}
	}
	return map[string]any{"type": "function", "function": map[string]any{"name": name, "description": desc, "parameters": schema}}
}

// The bound is a bound: on random Unicode of every density, in chat
// messages with and without tools, in completions' prompts and in the
// Responses and Messages APIs, the estimate before calibration is never
// below the simulator's real count (its /tokenize, of the chat request a
// Responses or Messages body converts to).
func TestEstimateBoundOnRandomUnicode(t *testing.T) {
	_, url := startSim(t, nil)
	mc := ModelConfig{}
	mc.defaults()
	est := newEstimator(mc.Estimate, defaultImageTokens)
	var pp fastjson.ParserPool
	r := rand.New(rand.NewPCG(3, 4))
	worst := math.Inf(1)
	for i := range 400 {
		kind := []endpoint{chatCompletions, completions, responsesAPI, messagesAPI}[i%4]
		body := map[string]any{"model": "llama-3-8b", "max_tokens": 1}
		var msgs []map[string]any
		for j := range 1 + r.IntN(4) {
			role := []string{"user", "assistant"}[j%2]
			if kind == chatCompletions && j == 0 && r.IntN(2) == 0 {
				role = "system"
			}
			msgs = append(msgs, map[string]any{"role": role, "content": randomText(r, r.IntN(400))})
		}
		var tools []any
		for range r.IntN(3) {
			tools = append(tools, randomTool(r, kind))
		}
		switch kind {
		case completions:
			body["prompt"] = randomText(r, r.IntN(2000))
		case responsesAPI:
			delete(body, "max_tokens")
			body["input"], body["instructions"] = msgs, randomText(r, r.IntN(100))
		default:
			body["messages"] = msgs
		}
		if len(tools) > 0 && kind != completions {
			body["tools"] = tools
		}
		raw, _ := json.Marshal(body)
		p := pp.Get()
		var req *request
		var err error
		if kind == responsesAPI || kind == messagesAPI {
			req, err = parseGeneration(p, raw, kind)
			if err == nil {
				err = generationTexts(&pp, raw, req)
			}
		} else {
			req, err = parseRequest(p, raw, kind)
			if err == nil {
				err = promptTexts(&pp, raw, req)
			}
		}
		pp.Put(p)
		if err != nil || len(req.prompts) != 1 {
			t.Fatalf("%s: %v (%d prompts to tokenize)", raw, err, len(req.prompts))
		}
		res := postJSON(url, "/tokenize", string(tokenizeBody(nil, req, 0)))
		var tk struct{ Count int }
		if err := json.Unmarshal([]byte(res.body), &tk); err != nil || res.status != 200 {
			t.Fatalf("tokenize %s: %d %s", tokenizeBody(nil, req, 0), res.status, res.body)
		}
		got := est.predict(req.shapes[0])
		if got < tk.Count {
			t.Fatalf("%s: estimated %d, the backend counts %d", raw, got, tk.Count)
		}
		worst = min(worst, float64(got)/float64(tk.Count))
	}
	t.Logf("the bound is at least %.2f× the real count", worst)
}

// An answer whose count passes the calibrated estimate sends it back to
// the bound at once, and calibration is earned again only from answers
// that include the one missed.
func TestEstimateWidensAfterAnUnderCount(t *testing.T) {
	mc := ModelConfig{Estimate: EstimateConfig{CalibrationMin: 8}}
	mc.defaults()
	e := newEstimator(mc.Estimate, defaultImageTokens)
	r := rand.New(rand.NewPCG(5, 6))
	english := func() promptShape {
		s := textShape([]byte(sentence(r, 200)))
		s.messages = 1
		return s
	}
	for range 8 {
		s := english()
		if e.observe(s, s.pieces+10) {
			t.Fatal("widened on counts below the bound")
		}
	}
	s := english()
	if st := e.state(); !st.Calibrated || e.predict(s) >= e.bound(s) {
		t.Fatalf("not calibrated after 8 answers: %+v, %d of bound %d", st, e.predict(s), e.bound(s))
	}
	// A prompt three times denser than the English it learnt from.
	dense := english()
	under := e.predict(dense) + 1
	if !e.observe(dense, under) {
		t.Fatal("an answer past its estimate did not widen")
	}
	st := e.state()
	if st.Calibrated || st.Widened != 1 || e.predict(dense) != e.bound(dense) {
		t.Fatalf("after the under-count: %+v, estimate %d, bound %d", st, e.predict(dense), e.bound(dense))
	}
	for range 7 {
		s := english()
		e.observe(s, s.pieces+10)
	}
	if got := e.predict(dense); got < under {
		t.Fatalf("calibrated again, the prompt missed is estimated %d, below its %d", got, under)
	}
}

// ratioHistogram is kvgate_prompt_tokens_actual_over_predicted of source.
func ratioHistogram(t *testing.T, gw *Server, source string) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	if err := gw.m.promptRatio.WithLabelValues("llama-3-8b", source).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram()
}

// routeBodies are a prompt on every route, with a function tool on all
// but completions.
func routeBodies(text string) map[string]string {
	q, _ := json.Marshal(text)
	params := `{"type":"object","properties":{"city":{"type":"string","description":"the city"}}}`
	return map[string]string{
		"/v1/chat/completions": `{"model":"llama-3-8b","max_tokens":3,"messages":[{"role":"user","content":` + string(q) + `}],"tools":[{"type":"function","function":{"name":"w","description":"weather","parameters":` + params + `}}]}`,
		"/v1/completions":      `{"model":"llama-3-8b","max_tokens":3,"prompt":` + string(q) + `}`,
		"/v1/responses":        `{"model":"llama-3-8b","max_output_tokens":3,"input":` + string(q) + `,"tools":[{"type":"function","name":"w","description":"weather","parameters":` + params + `}]}`,
		"/v1/messages":         `{"model":"llama-3-8b","max_tokens":3,"messages":[{"role":"user","content":` + string(q) + `}],"tools":[{"name":"w","description":"weather","input_schema":` + params + `}]}`,
	}
}

// Behind a backend without /tokenize, prompts of every density on every
// route are answered, each fallback is counted, and none is estimated
// below the backend's count. With /tokenize, the same prompts, tools and
// all, are counted exactly on every route (Responses and Messages as the
// chat request they convert to).
func TestPromptsCountedOnEveryRoute(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, noTokenize := range []bool{true, false} {
		_, url := startSim(t, func(c *sim.Config) { c.NoTokenize = noTokenize })
		gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
		for i := range 12 {
			for path, body := range routeBodies(randomText(r, 200+r.IntN(2000)) + fmt.Sprint(i)) {
				if res := postJSON(gwURL, path, body); res.status != 200 {
					t.Fatalf("%s: %d %.300s", path, res.status, res.body)
				}
			}
		}
		if noTokenize {
			if n := counter(gw.m.tokenizeFalls, "llama-3-8b", "error"); n != 48 {
				t.Errorf("without /tokenize, %v fallbacks counted, want 48", n)
			}
			h := ratioHistogram(t, gw, sourceEstimate)
			for _, b := range h.GetBucket() {
				if b.GetUpperBound() == 1 && b.GetCumulativeCount() != h.GetSampleCount() {
					t.Errorf("%d of %d prompts estimated below the backend's count", h.GetSampleCount()-b.GetCumulativeCount(), h.GetSampleCount())
				}
			}
			continue
		}
		h := ratioHistogram(t, gw, sourceBackend)
		if h.GetSampleCount() != 48 || h.GetSampleSum() != 48 {
			t.Errorf("with /tokenize: %d prompts counted by the backend, actual/predicted summing to %v; want 48 exact", h.GetSampleCount(), h.GetSampleSum())
		}
	}
}

func TestTextPieces(t *testing.T) {
	for _, tc := range []struct {
		text string
		want int
	}{
		{"", 0},
		{"hello world", 2 + 2},  // letters by fours, a space before a word goes with it
		{"1234567", 3},          // digits by threes
		{"a, b", 1 + 1 + 1},     // punctuation a piece
		{"x  y", 1 + 1 + 1},     // a run of spaces no word takes
		{"a\n\n\nb", 1 + 1 + 1}, // a newline run
		{"naïve", 1 + 1 + 1},    // "na", "ï", "ve"
		{"日本語", 2 + 1 + 2},      // one and a half a CJK character
		{"😀😀", 3 + 2},           // two and a half an emoji
		{"{\"a\":[1,2]}", 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1},
	} {
		if got := textPieces([]byte(tc.text)); got != tc.want {
			t.Errorf("textPieces(%q) = %d, want %d", tc.text, got, tc.want)
		}
	}
	var s promptShape
	s.addJSON([]byte(`{"a":[1,"x,{"],"b":{}}`))
	// { (depth 1) [ (2) , (2) ] (1) , (1) { (2) } (1) } (0); the string's , and { are text
	if s.layout != 2+3+3+2+2+3+2+1 || s.textBytes != 22 {
		t.Errorf("addJSON: layout %d, bytes %d", s.layout, s.textBytes)
	}
}

// Whatever the text and whatever the backend answers, an estimate is never
// above the bound nor negative, pieces never outnumber bytes, and the JSON
// layout scan never panics on malformed input.
func FuzzEstimate(f *testing.F) {
	f.Add([]byte("hello 日本 😀 {\"a\":[1,2]}"), uint16(7), true)
	f.Add([]byte(`{"x":"\"{[,"}`), uint16(0), false)
	mc := ModelConfig{Estimate: EstimateConfig{CalibrationMin: 1, CalibrationWindow: 4}}
	mc.defaults()
	f.Fuzz(func(t *testing.T, text []byte, actual uint16, asJSON bool) {
		e := newEstimator(mc.Estimate, defaultImageTokens)
		var s promptShape
		if asJSON {
			s.addJSON(text)
		} else {
			s.addText(text)
		}
		s.messages = 1
		if s.pieces > len(text) || s.layout < 0 {
			t.Fatalf("%q: %d pieces, layout %d", text, s.pieces, s.layout)
		}
		for range 3 {
			e.observe(s, int(actual))
			if p, b := e.predict(s), e.bound(s); p > b || p < 0 {
				t.Fatalf("%q after %d: estimate %d, bound %d", text, actual, p, b)
			}
		}
	})
}

// Between fits the line still covers every answer of the window: an
// answer above it is fitted at once, and one that leaves the window can
// only let the least line come down.
func TestEstimatorLineCoversTheWindow(t *testing.T) {
	mc := ModelConfig{Estimate: EstimateConfig{CalibrationWindow: 64}}
	mc.defaults()
	e := newEstimator(mc.Estimate, defaultImageTokens)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		s := textShape([]byte(strings.Repeat("word ", 1+r.IntN(200))))
		e.observe(s, s.pieces/2+r.IntN(s.pieces+8))
		e.mu.Lock()
		for _, p := range e.ring {
			if p.real > e.a*p.u+e.b+1e-9 {
				t.Fatalf("answer %d: point %+v above the line %v·u + %v", i, p, e.a, e.b)
			}
		}
		e.mu.Unlock()
	}
}

// The fit searches the window's upper hull alone: it finds the line the
// search over every point finds.
func TestEnvelopeOverTheHullIsTheWindows(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var hull []point
	for i := range 500 {
		ps := make([]point, 1+r.IntN(256))
		for j := range ps {
			u := float64(1 + r.IntN(1+i*8))
			if i%5 == 0 {
				u = float64(1 + r.IntN(4)) // many points on one u
			}
			ps[j] = point{u, math.Floor(u*(0.5+r.Float64())) + float64(r.IntN(40))}
		}
		want := slices.Clone(ps)
		a, b, h := envelope(ps, hull)
		hull = h
		if !slices.Equal(ps, want) {
			t.Fatalf("set %d: the window was reordered", i)
		}
		wa, wb := envelopeOverAll(ps)
		if math.Abs(a-wa) > 1e-9*max(1, wa) || math.Abs(b-wb) > 1e-9*max(1, math.Abs(wb)) {
			t.Fatalf("set %d (%d points): line %v·u + %v, want %v·u + %v", i, len(ps), a, b, wa, wb)
		}
	}
}

// envelopeOverAll is the fit searching every point of the window.
func envelopeOverAll(ps []point) (a, b float64) {
	var mean, hi float64
	for _, p := range ps {
		mean += p.u
		hi = max(hi, p.real/max(p.u, 1))
	}
	mean /= float64(len(ps))
	lo := 0.0
	for range 48 {
		m1, m2 := lo+(hi-lo)/3, hi-(hi-lo)/3
		if m1*mean+above(ps, m1) <= m2*mean+above(ps, m2) {
			hi = m2
		} else {
			lo = m1
		}
	}
	a = (lo + hi) / 2
	return a, above(ps, a)
}
