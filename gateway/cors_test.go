package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// A browser's preflight from an allowed origin is answered with the grants
// it asked for; from another origin, or for a method or header not allowed,
// it is refused; an allowed origin's real request gets the headers that let
// its page read the answer. Without server.cors a preflight is refused
// saying what to set.
func TestCORS(t *testing.T) {
	_, url := startSim(t, nil)
	_, gw := startGateway(t, baseConfig(url, `server:
  cors:
    allowed_origins: ["https://app.example.com", "http://localhost:5173/"]
`), Options{})
	_, plain := startGateway(t, baseConfig(url, ""), Options{})
	preflight := func(base, origin, method, headers string) *http.Response {
		req, _ := http.NewRequest(http.MethodOptions, base+"/v1/chat/completions", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", method)
		if headers != "" {
			req.Header.Set("Access-Control-Request-Headers", headers)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, tc := range []struct {
		name, base, origin, method, headers string
		status                              int
		granted                             bool
	}{
		{"allowed origin", gw, "https://app.example.com", "POST", "authorization, content-type, x-stainless-os", 204, true},
		{"allowed origin with a trailing slash in the config", gw, "http://localhost:5173", "POST", "", 204, true},
		{"another origin", gw, "https://evil.example.com", "POST", "authorization", 403, false},
		{"a method not allowed", gw, "https://app.example.com", "DELETE", "", 403, false},
		{"a header not allowed", gw, "https://app.example.com", "POST", "x-secret", 403, false},
		{"no cors configured", plain, "https://app.example.com", "POST", "", 403, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := preflight(tc.base, tc.origin, tc.method, tc.headers)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			got := resp.Header.Get("Access-Control-Allow-Origin")
			if tc.granted != (got == tc.origin) || (!tc.granted && got != "") {
				t.Fatalf("Access-Control-Allow-Origin %q (granted %v)", got, tc.granted)
			}
			if tc.granted && (!strings.Contains(resp.Header.Get("Access-Control-Allow-Methods"), "POST") ||
				resp.Header.Get("Access-Control-Allow-Headers") != tc.headers) {
				t.Fatalf("grants: methods %q, headers %q", resp.Header.Get("Access-Control-Allow-Methods"), resp.Header.Get("Access-Control-Allow-Headers"))
			}
		})
	}
	for _, tc := range []struct {
		origin string
		read   bool
	}{{"https://app.example.com", true}, {"https://evil.example.com", false}} {
		r := postJSON(gw, "/v1/chat/completions", chatBody("hi", 5, false), "Origin", tc.origin)
		if r.status != 200 {
			t.Fatalf("%s: status %d %s", tc.origin, r.status, r.body)
		}
		if got := r.header.Get("Access-Control-Allow-Origin") == tc.origin; got != tc.read ||
			tc.read != strings.Contains(r.header.Get("Access-Control-Expose-Headers"), "Retry-After") {
			t.Errorf("%s: answer's CORS headers %v", tc.origin, r.header)
		}
	}
}

func TestCORSConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"server: {cors: {}}\n", "server.cors.allowed_origins: list at least one origin"},
		{"server: {cors: {allowed_origins: [app.example.com]}}\n", "server.cors.allowed_origins[0]: \"app.example.com\" is not an origin"},
		{"server: {cors: {allowed_origins: [\"https://a.example/path\"]}}\n", "server.cors.allowed_origins[0]"},
		{"server: {cors: {allowed_origins: [\"*\"], allowed_methods: [\"GET POST\"]}}\n", "server.cors.allowed_methods[0]"},
	} {
		_, err := Parse([]byte(baseConfig("http://127.0.0.1:1", tc.yaml)), ".")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// With CORS off, a preflight's refusal says it is CORS and what to set,
// rather than a 405 for OPTIONS.
func TestPreflightWithCORSOffSaysWhatToSet(t *testing.T) {
	_, url := startSim(t, nil)
	_, gw := startGateway(t, baseConfig(url, ""), Options{})
	req, _ := http.NewRequest(http.MethodOptions, gw+"/v1/chat/completions", nil)
	req.Header.Set("Origin", "http://localhost:5173")
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	e := decodeError(t, string(b))
	if resp.StatusCode != 403 || e.Error.Code == nil || *e.Error.Code != "cors_forbidden" ||
		!strings.Contains(e.Error.Message, "server.cors.allowed_origins") || !strings.Contains(e.Error.Message, "--cors-origin http://localhost:5173") {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
	if resp.Header.Get("X-Request-Id") == "" {
		t.Error("the refusal carries no X-Request-Id")
	}
	// A plain OPTIONS, not a preflight, is still a wrong method.
	req, _ = http.NewRequest(http.MethodOptions, gw+"/v1/chat/completions", nil)
	resp, err = httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("plain OPTIONS: %d", resp.StatusCode)
	}
}
