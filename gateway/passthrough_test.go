package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// echoBackend answers every request with what it received: method, URI,
// content type and body; /health is healthy.
func echoBackend(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusTeapot) // the backend's own status, relayed
		io.WriteString(w, r.Method+" "+r.RequestURI+" "+r.Header.Get("Content-Type")+" "+string(b))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestPassthroughRoutes(t *testing.T) {
	url := echoBackend(t)
	cfg := baseConfig(url, "tenants:\n  - name: a\n    api_keys: [k]\n") + ""
	cfg = strings.Replace(cfg, "  - name: llama-3-8b\n", "  - name: llama-3-8b\n    served_name: llama\n", 1)
	_, gw := startGateway(t, cfg, Options{DisableProbes: true})

	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	mw.WriteField("model", "llama")
	mw.WriteField("file", "RIFF")
	mw.Close()
	for _, tc := range []struct {
		name, method, path, ctype, body string
		status                          int
		want                            string // in the answer
	}{
		{"a GET with no model", "GET", "/version", "", "", 418, "GET /version"},
		{"a JSON body's alias, rewritten", "POST", "/detokenize?x=1", "application/json", `{"model":"llama","tokens":[1,2]}`, 418, `POST /detokenize?x=1 application/json {"model":"llama-3-8b","tokens":[1,2]}`},
		{"a form's model", "POST", "/v1/audio/transcriptions", mw.FormDataContentType(), form.String(), 418, "POST /v1/audio/transcriptions multipart/form-data"},
		// Routes are matched on the normalized path: this is the gateway's
		// own /metrics, never the backend's.
		{"a path that climbs out of the route", "GET", "/version/../v1/audio/../../metrics", "", "", 200, "# HELP kvgate_"},
		{"a path normalized into the route", "GET", "/x/../version", "", "", 418, "GET /version "},
		{"an unknown model", "POST", "/detokenize", "application/json", `{"model":"gpt-4","tokens":[1]}`, 404, "model_not_found"},
		{"a JSON body that is not JSON", "POST", "/detokenize", "application/json", `{"model":`, 400, "could not parse"},
		{"a route not listed", "GET", "/invocations", "", "", 404, "passes through /detokenize, /tokenizer_info, /version, /v1/audio/*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, gw+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer k")
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			res, err := httpClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
				t.Fatalf("%d %s; want %d with %q", res.StatusCode, b, tc.status, tc.want)
			}
		})
	}
	t.Run("without the key", func(t *testing.T) {
		res, err := httpClient.Get(gw + "/version")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 401 {
			t.Fatalf("status %d, want 401", res.StatusCode)
		}
	})
}

func TestPassthroughConfig(t *testing.T) {
	for _, tc := range []struct {
		list, want string
	}{
		{"[]", ""},
		{"[/version, /invocations]", ""},
		{"[/v1/rerank]", `passthrough[0]: "/v1/rerank" takes in /v1/rerank`},
		{"[version]", `passthrough[0]: "version" is not a path from the root`},
		{"[/v1/*/x]", `passthrough[0]: "/v1/*/x" is not a path from the root`},
		{"[/v1/*]", `passthrough[0]: "/v1/*" takes in /v1/chat/completions, which the gateway serves itself`},
		{"[/status]", `passthrough[0]: "/status" takes in /status`},
	} {
		t.Run(tc.list, func(t *testing.T) {
			_, err := Parse([]byte(baseConfig("http://127.0.0.1:1", "passthrough: "+tc.list+"\n")), ".")
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestDetokenizeRoundTripThroughGateway: the ids the gateway's /tokenize
// answers, passed back through its /detokenize to the simulated vLLM,
// give the text back.
func TestDetokenizeRoundTripThroughGateway(t *testing.T) {
	_, url := startSim(t, nil)
	_, gw := startGateway(t, baseConfig(url, ""), Options{})
	tests := []struct{ name, tokenize, want string }{
		{"prompt", `{"model":"llama-3-8b","prompt":"Hello, world! 12345 ünïcödé","add_special_tokens":false}`, "Hello, world! 12345 ünïcödé"},
		{"prompt with BOS", `{"model":"llama-3-8b","prompt":"Once upon a time"}`, "<|begin_of_text|>Once upon a time"},
		{"chat", `{"model":"llama-3-8b","messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":false}`,
			"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := postJSON(gw, "/tokenize", tc.tokenize)
			if tok.err != nil || tok.status != 200 {
				t.Fatalf("/tokenize: %d %v %s", tok.status, tok.err, tok.body)
			}
			var tr struct {
				Tokens json.RawMessage `json:"tokens"`
			}
			if err := json.Unmarshal([]byte(tok.body), &tr); err != nil || len(tr.Tokens) < 3 {
				t.Fatalf("/tokenize answered %s (%v)", tok.body, err)
			}
			de := postJSON(gw, "/detokenize", `{"model":"llama-3-8b","tokens":`+string(tr.Tokens)+`}`)
			if de.err != nil || de.status != 200 {
				t.Fatalf("/detokenize: %d %v %s", de.status, de.err, de.body)
			}
			var dr struct {
				Prompt string `json:"prompt"`
			}
			if err := json.Unmarshal([]byte(de.body), &dr); err != nil || dr.Prompt != tc.want {
				t.Errorf("/detokenize of %s = %s (%v), want prompt %q", tr.Tokens, de.body, err, tc.want)
			}
		})
	}
}
