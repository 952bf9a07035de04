package gateway

import (
	"bytes"
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
