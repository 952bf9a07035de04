package gateway

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/syncbuf"
)

// A backend url with user:password@ is refused where it is read, naming the
// field and api_key: the gateway sends only api_key upstream, and shows the
// url on /status, in logs and in spans. So the password reaches none of the
// places a backend url can appear, and a refused reload leaves the running
// configuration (and its url) as it was.
func TestBackendURLCredentialsRefused(t *testing.T) {
	const password = "backendPW987"
	withCreds := func(simURL string) string {
		return strings.Replace(simURL, "http://", "http://backenduser:"+password+"@", 1)
	}
	noPassword := func(where, s string) {
		t.Helper()
		if strings.Contains(s, password) {
			t.Errorf("%s shows the password: %s", where, s)
		}
	}

	for _, tc := range []struct{ name, url, want string }{
		{"user and password", "http://backenduser:" + password + "@127.0.0.1:8000", "backends[0].url: holds credentials"},
		{"https", "https://backenduser:" + password + "@vllm.example", "backends[0].url: holds credentials"},
		{"user alone", "http://" + password + "@127.0.0.1:8000", "backends[0].url: holds credentials"},
		{"and a bad scheme", "htp://backenduser:" + password + "@127.0.0.1:8000", "backends[0].url: \"htp://***@127.0.0.1:8000\": want http://"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(baseConfig(tc.url, "")), ".")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if strings.Contains(tc.want, "credentials") && !strings.Contains(err.Error(), "backends[0].api_key") {
				t.Errorf("the error does not point to api_key: %v", err)
			}
			noPassword("the config error", err.Error())
		})
	}

	// A running gateway asked to reload into such a url refuses, logs no
	// password, and shows none on /status, /metrics, in spans or an
	// error body.
	s, simURL := startSim(t, nil)
	rcv := startReceiver(t)
	var logs syncbuf.Buffer
	gw, gwURL := startGateway(t, baseConfig(simURL, tracingYAML(rcv.url, "")), Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	err := gw.ReloadFrom(func() (*Config, error) { return Parse([]byte(baseConfig(withCreds(simURL), "")), ".") })
	if err == nil || !strings.Contains(err.Error(), "backends[0].url: holds credentials") {
		t.Fatalf("reload: %v", err)
	}
	noPassword("the reload error", err.Error())
	if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 3, false)); r.status != 200 {
		t.Fatalf("after the refused reload: %d %s", r.status, r.body)
	}
	for _, path := range []string{"/status", "/metrics"} {
		resp, err := http.Get(gwURL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		noPassword(path, string(b))
		if path == "/status" && !strings.Contains(string(b), simURL) {
			t.Errorf("/status lost the running url %s: %s", simURL, b)
		}
	}
	for _, sp := range rcv.flushUntil(t, gw, 2) {
		for _, kv := range sp.Attributes {
			noPassword("span "+sp.Name+" "+kv.Key, kv.Value.String())
		}
	}
	s.Shutdown(t.Context())
	r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 3, false))
	if r.status < 500 {
		t.Fatalf("with the backend gone: %d %s", r.status, r.body)
	}
	noPassword("the error body", r.body)
	if host := strings.TrimPrefix(simURL, "http://"); strings.Contains(r.body, host) {
		t.Errorf("the error body shows the backend's address %s: %s", host, r.body)
	}
	noPassword("the log", logs.String())
}
