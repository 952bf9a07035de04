package gateway

import (
	"strings"
	"testing"
)

// POST /tokenize through the gateway counts as the model's backend does,
// and is refused in OpenAI's shape for a missing or unknown model.
func TestTokenizePassthrough(t *testing.T) {
	_, simURL := startSim(t, nil)
	_, gwURL := startGateway(t, baseConfig(simURL, ""), Options{})
	body := `{"model":"llama-3-8b","prompt":"` + words(50) + `"}`
	direct := postJSON(simURL, "/tokenize", body)
	via := postJSON(gwURL, "/tokenize", body)
	if direct.status != 200 || via.status != 200 || via.body != direct.body || !strings.Contains(via.body, `"count"`) {
		t.Fatalf("direct %d %s; via the gateway %d %s", direct.status, direct.body, via.status, via.body)
	}
	for _, tc := range []struct {
		body   string
		status int
		code   string
	}{
		{`{"prompt":"hi"}`, 400, ""},
		{`{"model":"gpt-9","prompt":"hi"}`, 404, "model_not_found"},
		{`not json`, 400, ""},
	} {
		r := postJSON(gwURL, "/tokenize", tc.body)
		e := decodeError(t, r.body)
		code := ""
		if e.Error.Code != nil {
			code = *e.Error.Code
		}
		if r.status != tc.status || code != tc.code {
			t.Errorf("%s: %d %s", tc.body, r.status, r.body)
		}
	}
}
