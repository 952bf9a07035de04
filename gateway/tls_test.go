package gateway

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testcerts"
)

// startTLSSim runs the simulated vLLM behind TLS with cert; it returns its
// https:// URL.
func startTLSSim(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	s := newSim(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}}))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return "https://" + ln.Addr().String()
}

// withBackendTLS adds a tls section (YAML flow mapping) to the backend at
// url in cfg.
func withBackendTLS(cfg, url, section string) string {
	line := "    url: " + url + "\n"
	return strings.Replace(cfg, line, line+"    tls: "+section+"\n", 1)
}

// TestTLSBackendThroughGateway: a chat completion, streamed and not,
// reaches a backend served over TLS with the test's CA; with a CA that did
// not sign it, the client gets a 502 naming the backend and the TLS
// failure (not the address), the log gets the certificate's detail, and
// the failure counts against the backend's circuit as one to connect.
func TestTLSBackendThroughGateway(t *testing.T) {
	dir := t.TempDir()
	ca, other := testcerts.NewCA(t, "backend CA"), testcerts.NewCA(t, "other CA")
	caFile, otherFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "other.pem")
	testcerts.WriteFile(t, caFile, ca.CertPEM)
	testcerts.WriteFile(t, otherFile, other.CertPEM)
	simURL := startTLSSim(t, ca.Server(t, "sim").TLS(t))

	tests := []struct {
		name       string
		caFile     string
		stream     bool
		wantStatus int
		wantBody   string
	}{
		{name: "not streamed", caFile: caFile, wantStatus: 200, wantBody: `"finish_reason"`},
		{name: "streamed", caFile: caFile, stream: true, wantStatus: 200, wantBody: "data: [DONE]"},
		{name: "wrong CA", caFile: otherFile, wantStatus: 502, wantBody: `The backend \"gpu0\" could not be reached: its TLS handshake failed.`},
		{name: "wrong CA streamed", caFile: otherFile, stream: true, wantStatus: 502, wantBody: "TLS handshake failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs syncBuffer
			cfg := withBackendTLS(baseConfig(simURL, ""), simURL, "{ca_file: "+tt.caFile+"}")
			// No probes: the request itself meets the backend first.
			s, gw := startGateway(t, cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), DisableProbes: true})
			r := postJSON(gw, "/v1/chat/completions", chatBody(words(20), 8, tt.stream))
			if r.err != nil || r.status != tt.wantStatus || !strings.Contains(r.body, tt.wantBody) {
				t.Fatalf("got %d %v %.400s; want %d with %q", r.status, r.err, r.body, tt.wantStatus, tt.wantBody)
			}
			if tt.wantStatus == 200 {
				return
			}
			if host := strings.TrimPrefix(simURL, "https://"); strings.Contains(r.body, host) {
				t.Errorf("the 502 shows the backend's address: %s", r.body)
			}
			if l := logs.String(); !strings.Contains(l, "backend=gpu0") || !strings.Contains(l, "certificate signed by unknown authority") {
				t.Errorf("no log line names the backend and the certificate problem:\n%s", l)
			}
			be := s.rt.Load().pool.Backends()[0]
			if !strings.Contains(be.LastError(), "TLS handshake failed") {
				t.Errorf("the circuit did not count the handshake: last error %q", be.LastError())
			}
		})
	}
}

// TestTLSConfigErrors: every TLS setting is checked at load, files read and
// parsed, and a problem names its field.
func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "CA")
	pair, stranger := ca.Server(t, "a"), ca.Server(t, "b")
	caFile, junk := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "junk.pem")
	testcerts.WriteFile(t, caFile, ca.CertPEM)
	testcerts.WriteFile(t, junk, []byte("not a certificate\n"))
	certFile, keyFile := pair.Write(t, dir, "a")
	_, otherKey := stranger.Write(t, dir, "b")
	missing := filepath.Join(dir, "missing.pem")
	const https = "https://127.0.0.1:8443"

	tests := []struct {
		name, url, tls string
		want           string // "" = valid
	}{
		{name: "valid", url: https, tls: "{ca_file: " + caFile + ", server_name: vllm.internal, cert_file: " + certFile + ", key_file: " + keyFile + "}"},
		{name: "https without tls", url: https},
		{name: "tls on http", url: "http://127.0.0.1:8000", tls: "{ca_file: " + caFile + "}", want: "backends[0].tls: given for url"},
		{name: "unknown scheme", url: "ftp://127.0.0.1:21", want: "backends[0].url: \"ftp://127.0.0.1:21\": want http://host:port or https://"},
		{name: "ca_file missing", url: https, tls: "{ca_file: " + missing + "}", want: "backends[0].tls.ca_file: open " + missing},
		{name: "ca_file not PEM", url: https, tls: "{ca_file: " + junk + "}", want: "backends[0].tls.ca_file: " + junk + ": no PEM certificate found"},
		{name: "cert without key", url: https, tls: "{cert_file: " + certFile + "}", want: "backends[0].tls.key_file: required with cert_file"},
		{name: "key without cert", url: https, tls: "{key_file: " + keyFile + "}", want: "backends[0].tls.cert_file: required with key_file"},
		{name: "key of another cert", url: https, tls: "{cert_file: " + certFile + ", key_file: " + otherKey + "}", want: "backends[0].tls.cert_file: " + certFile + " with key_file " + otherKey},
		{name: "unknown key", url: https, tls: "{ca: " + caFile + "}", want: "backends[0].tls.ca: unknown key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := baseConfig(tt.url, "")
			if tt.tls != "" {
				cfg = withBackendTLS(cfg, tt.url, tt.tls)
			}
			_, err := Parse([]byte(cfg), dir)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("valid config refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v; want it to say %q", err, tt.want)
			}
		})
	}
}
