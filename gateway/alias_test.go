package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// A model's served_name is what clients send and see: the backend is sent
// its own name, the answers (whole and streamed) and /v1/models give the
// served name back, /tokenize takes it, and the backend's name is not
// served.
func TestServedName(t *testing.T) {
	_, url := startSim(t, nil)
	cfg := strings.Replace(baseConfig(url, ""), "  - name: llama-3-8b\n", "  - name: llama-3-8b\n    served_name: chat\n", 1)
	_, gw := startGateway(t, cfg, Options{})
	body := func(model string, stream bool) string {
		return strings.Replace(chatBody("hello", 5, stream), `"model":"llama-3-8b"`, `"model":"`+model+`"`, 1)
	}
	for _, stream := range []bool{false, true} {
		r := postJSON(gw, "/v1/chat/completions", body("chat", stream))
		if r.status != 200 || strings.Contains(r.body, "llama-3-8b") || !strings.Contains(r.body, `"model":"chat"`) {
			t.Errorf("stream %v: %d %.400s", stream, r.status, r.body)
		}
	}
	if r := postJSON(gw, "/v1/chat/completions", body("llama-3-8b", false)); r.status != 404 {
		t.Errorf("the backend's own name: %d %s", r.status, r.body)
	}
	if r := postJSON(gw, "/tokenize", `{"model":"chat","prompt":"hello there"}`); r.status != 200 || !strings.Contains(r.body, `"count"`) {
		t.Errorf("tokenize by the served name: %d %s", r.status, r.body)
	}
	resp, err := http.Get(gw + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) != 1 || list.Data[0].ID != "chat" {
		t.Errorf("/v1/models: %+v, %v", list, err)
	}
}

func TestServedNameMustBeUnique(t *testing.T) {
	cfg := strings.Replace(fleetConfig("", "http://127.0.0.1:1"), "  - name: llama-3-8b\n", "  - name: llama-3-8b\n    served_name: chat\n", 1)
	cfg = strings.Replace(cfg, "backends:\n", `  - name: chat
    geometry: {layers: 32, kv_heads: 8, head_dim: 128, dtype: bfloat16}
    weights_bytes: 16060522496
backends:
`, 1)
	if _, err := Parse([]byte(cfg), "."); err == nil || !strings.Contains(err.Error(), `models[1].name: "chat" is already a name clients send`) {
		t.Errorf("error %v", err)
	}
}

// A LoRA adapter (models[].base) counts only its own weights beside its
// base's on the GPU that serves both: where two full models do not fit, the
// base and its adapter do, and share the GPU's budget.
func TestLoRAAdapterCountsItsOwnWeights(t *testing.T) {
	cfg := func(adapter string) string {
		c := strings.Replace(fleetConfig("", "http://127.0.0.1:1"), "backends:\n", adapter+"backends:\n", 1)
		return strings.Replace(c, "models: [llama-3-8b]", "models: [llama-3-8b, llama-lora]", 1)
	}
	twice := cfg(`  - name: llama-lora
    geometry: {layers: 32, kv_heads: 8, head_dim: 128, dtype: bfloat16}
    weights_bytes: 16060522496
`)
	c, err := Parse([]byte(twice), ".")
	if err == nil {
		var s *Server
		if s, err = New(c, Options{DisableProbes: true}); err == nil {
			s.Shutdown(t.Context())
		}
	}
	if err == nil || !strings.Contains(err.Error(), "do not fit") {
		t.Fatalf("the base's weights counted twice should not fit a 24 GiB GPU: %v", err)
	}
	c, err = Parse([]byte(cfg("  - {name: llama-lora, base: llama-3-8b, weights_bytes: 200MiB}\n")), ".")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(c, Options{DisableProbes: true})
	if err != nil {
		t.Fatalf("an adapter beside its base: %v", err)
	}
	defer s.Shutdown(t.Context())
	rt := s.rt.Load()
	lora, base := rt.models["llama-lora"], rt.models["llama-3-8b"]
	if lora == nil || lora.layout != base.layout || lora.maxLen != base.maxLen || lora.weights != 200<<20 {
		t.Fatalf("adapter %+v, base %+v", lora, base)
	}
	if pools := rt.sched.Stats().GPUs; len(pools) != 1 {
		t.Fatalf("base and adapter on one GPU should share one budget: %d pools", len(pools))
	}
	for _, tc := range []struct{ yaml, want string }{
		{"  - {name: x, base: nope}\n", `models[1].base: "nope" is not one of the models`},
		{"  - {name: x, base: llama-3-8b, tp: 2}\n", "an adapter (base: llama-3-8b) takes its base's"},
	} {
		if _, err := Parse([]byte(cfg(tc.yaml)), "."); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
}
