package gateway

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
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

// The estimate tokenizer starts from a ratio that is far off (2 bytes a
// token; the simulator's tokenizer gives about 3.5 on this text) and
// calibrates toward the backend's real counts from the usage it returns:
// its error on fresh prompts shrinks to within its margin.
func TestEstimateCalibratesTowardBackend(t *testing.T) {
	_, url := startSim(t, nil)
	cfg := strings.Replace(baseConfig(url, ""), "tokenizer: backend", "tokenizer: estimate\n    estimate: {bytes_per_token: 2, margin: 0.05}", 1)
	gw, gwURL := startGateway(t, cfg, Options{})
	m := gw.rt.Load().models["llama-3-8b"]
	r := rand.New(rand.NewPCG(1, 2))

	// relErr is the estimate's error on a fresh prompt against the
	// backend's own count (its /tokenize, the exact answer).
	relErr := func() float64 {
		text := sentence(r, 100+r.IntN(300))
		body, _ := json.Marshal(map[string]any{"model": "llama-3-8b", "messages": []map[string]string{{"role": "user", "content": text}}})
		res := postJSON(url, "/tokenize", string(body))
		var tk struct{ Count int }
		if err := json.Unmarshal([]byte(res.body), &tk); err != nil || tk.Count == 0 {
			t.Fatalf("tokenize: %s", res.body)
		}
		predicted := m.est.predict(promptShape{textBytes: len(text), messages: 1})
		return float64(predicted-tk.Count) / float64(tk.Count)
	}
	before := relErr()
	for range 30 {
		if res := postJSON(gwURL, "/v1/chat/completions", chatBody(sentence(r, 50+r.IntN(400)), 2, false)); res.status != 200 {
			t.Fatalf("%d %s", res.status, res.body)
		}
	}
	var worst float64
	for range 10 {
		e := relErr()
		worst = max(worst, math.Abs(e-0.05)) // the margin is deliberate over-prediction
	}
	t.Logf("error before calibration %+.0f%%, worst after (net of the 5%% margin) %.1f%%; ratio now %.2f bytes/token",
		100*before, 100*worst, m.est.bytesPerToken())
	if before < 0.4 {
		t.Fatalf("the starting ratio was not far off (%+.0f%%): the test proves nothing", 100*before)
	}
	if worst > 0.06 {
		t.Errorf("after calibration the estimate is still %.1f%% off", 100*worst)
	}
	if got := fmt.Sprintf("%.0f", m.est.bytesPerToken()); got == "2" {
		t.Error("the ratio did not move")
	}
}

// Review finding: an estimate (which errs high on purpose) turned requests
// that fit into 400 context_length_exceeded. Only exact counts may refuse;
// an estimate that says "too long" reserves the whole context instead.
func TestEstimateNeverRefusesWhatFits(t *testing.T) {
	_, url := startSim(t, nil)
	cfg := strings.Replace(baseConfig(url, ""), "tokenizer: backend", "tokenizer: estimate\n    estimate: {bytes_per_token: 4, margin: 0.1}", 1)
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
