package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/internal/syncbuf"
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
			var logs syncbuf.Buffer
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
			be := s.rt.Load().upstreams.Backends()[0]
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
		server         string // server.tls, a flow mapping
		want           string // "" = valid
	}{
		{name: "server valid", url: https, server: "{cert_file: " + certFile + ", key_file: " + keyFile + ", client_ca_file: " + caFile + "}"},
		{name: "server without key", url: https, server: "{cert_file: " + certFile + "}", want: "server.tls.key_file: required"},
		{name: "server without cert", url: https, server: "{key_file: " + keyFile + "}", want: "server.tls.cert_file: required"},
		{name: "server cert missing", url: https, server: "{cert_file: " + missing + ", key_file: " + keyFile + "}", want: "server.tls.cert_file: open " + missing},
		{name: "server key of another cert", url: https, server: "{cert_file: " + certFile + ", key_file: " + otherKey + "}", want: "server.tls.cert_file: " + certFile + " with key_file " + otherKey},
		{name: "server client CA not PEM", url: https, server: "{cert_file: " + certFile + ", key_file: " + keyFile + ", client_ca_file: " + junk + "}", want: "server.tls.client_ca_file: " + junk + ": no PEM certificate found"},
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
			if tt.server != "" {
				cfg = baseConfig(tt.url, "server:\n  tls: "+tt.server+"\n")
			}
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

// tlsClient is an HTTP client trusting roots, presenting cert when given.
// It keeps no connections, so each request makes a handshake of its own.
func tlsClient(roots *x509.CertPool, cert *tls.Certificate) *http.Client {
	c := &tls.Config{RootCAs: roots}
	if cert != nil {
		// Sent whatever the server asks for: Go's client would keep back a
		// certificate of a CA the server does not name.
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: c, DisableKeepAlives: true}, Timeout: 30 * time.Second}
}

// TestTLSListener: the gateway serves HTTPS to a client trusting the
// test's CA; with client_ca_file it refuses, at the handshake, a client
// without a certificate that CA signed.
func TestTLSListener(t *testing.T) {
	dir := t.TempDir()
	ca, clientCA, other := testcerts.NewCA(t, "gateway CA"), testcerts.NewCA(t, "client CA"), testcerts.NewCA(t, "other CA")
	certFile, keyFile := ca.Server(t, "gateway").Write(t, dir, "gateway")
	clientCAFile := filepath.Join(dir, "clients.pem")
	testcerts.WriteFile(t, clientCAFile, clientCA.CertPEM)
	good, stranger := clientCA.Client(t, "app").TLS(t), other.Client(t, "app").TLS(t)
	_, simURL := startSim(t, nil)

	tests := []struct {
		name     string
		clientCA bool // server.tls.client_ca_file set
		roots    *x509.CertPool
		cert     *tls.Certificate
		wantErr  string // "" = served
	}{
		{name: "trusted", roots: ca.Pool()},
		{name: "untrusted server", roots: other.Pool(), wantErr: "certificate signed by unknown authority"},
		{name: "client certificate", clientCA: true, roots: ca.Pool(), cert: &good},
		{name: "no client certificate", clientCA: true, roots: ca.Pool(), wantErr: "certificate required"},
		{name: "client certificate of another CA", clientCA: true, roots: ca.Pool(), cert: &stranger, wantErr: "unknown certificate authority"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			section := "{cert_file: " + certFile + ", key_file: " + keyFile + "}"
			if tt.clientCA {
				section = "{cert_file: " + certFile + ", key_file: " + keyFile + ", client_ca_file: " + clientCAFile + "}"
			}
			_, gw := startGateway(t, baseConfig(simURL, "server:\n  tls: "+section+"\n"), Options{})
			addr := strings.TrimPrefix(gw, "http://")
			client := tlsClient(tt.roots, tt.cert)
			if tt.wantErr != "" {
				err := handshake(addr, client.Transport.(*http.Transport).TLSClientConfig)
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("handshake: %v; want it refused with %q", err, tt.wantErr)
				}
				return
			}
			resp, err := client.Post("https://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(words(10), 4, false)))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
				t.Fatalf("%d %s over %+v", resp.StatusCode, body, resp.TLS)
			}
		})
	}
}

// handshake runs a TLS handshake with addr and waits for the server's
// verdict on it. Under TLS 1.3 the client's side completes before the
// server has checked the client's certificate, so the refusal comes as an
// alert on the first read; sending nothing first keeps the server's close
// from resetting the connection before the alert is read.
func handshake(addr string, cfg *tls.Config) error {
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	_, err = c.Read(make([]byte, 1))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil // accepted: the server waits for a request
	}
	return err
}

// servedLeaf is the certificate a new TLS connection to addr is shown.
func servedLeaf(t *testing.T, addr string, roots *x509.CertPool) *x509.Certificate {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0]
}

// TestTLSListenerReload: a reload (what SIGHUP runs) serves the pair now
// in the files to new connections; a reload whose pair does not load fails
// naming the field and keeps the served one.
func TestTLSListenerReload(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "gateway CA")
	first, second, third := ca.Server(t, "first"), ca.Server(t, "second"), ca.Server(t, "third")
	certFile, keyFile := first.Write(t, dir, "gateway")
	_, simURL := startSim(t, nil)
	cfg := baseConfig(simURL, "server:\n  tls: {cert_file: gateway.crt, key_file: gateway.key}\n")
	parsed, err := Parse([]byte(cfg), dir)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	s, err := New(parsed, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(serveLoopback(t, s.Serve, s.Shutdown), "http://")
	reload := func() error { return s.ReloadFrom(func() (*Config, error) { return Parse([]byte(cfg), dir) }) }

	steps := []struct {
		name     string
		cert     []byte // written to the cert file; the key below to the key file
		key      []byte
		wantErr  string
		wantLeaf testcerts.Pair
	}{
		{name: "rotated", cert: second.CertPEM, key: second.KeyPEM, wantLeaf: second},
		{name: "key of another certificate", cert: third.CertPEM, key: first.KeyPEM, wantErr: "server.tls.cert_file: gateway.crt with key_file gateway.key", wantLeaf: second},
		{name: "not PEM", cert: []byte("junk"), key: third.KeyPEM, wantErr: "server.tls.cert_file", wantLeaf: second},
		{name: "rotated again", cert: third.CertPEM, key: third.KeyPEM, wantLeaf: third},
	}
	if got := servedLeaf(t, addr, ca.Pool()); !got.Equal(first.Leaf) {
		t.Fatalf("serving %s; want %s", got.Subject, first.Leaf.Subject)
	}
	for _, st := range steps {
		testcerts.WriteFile(t, certFile, st.cert)
		testcerts.WriteFile(t, keyFile, st.key)
		err := reload()
		switch {
		case st.wantErr == "" && err != nil:
			t.Fatalf("%s: reload: %v", st.name, err)
		case st.wantErr != "" && (err == nil || !strings.Contains(err.Error(), st.wantErr)):
			t.Fatalf("%s: reload error %v; want %q", st.name, err, st.wantErr)
		}
		if got := servedLeaf(t, addr, ca.Pool()); !got.Equal(st.wantLeaf.Leaf) {
			t.Fatalf("%s: a new connection is shown %s; want %s", st.name, got.Subject, st.wantLeaf.Leaf.Subject)
		}
	}
	if !strings.Contains(logs.String(), "serving the reloaded TLS certificate") {
		t.Errorf("no log line for the new certificate:\n%s", logs.String())
	}
}

// TestTLSListenerHangUpWhileQueued: a queued request whose client hangs up
// leaves the queue over TLS as over plain TCP — the hang-up watch looks at
// the socket beneath the TLS connection, which has no descriptor of its
// own.
func TestTLSListenerHangUpWhileQueued(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "gateway CA")
	certFile, keyFile := ca.Server(t, "gateway").Write(t, dir, "gateway")
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	gw, gwURL := startGateway(t, baseConfig(url, "admission:\n  queue: {timeout: 60s}\nserver:\n  tls: {cert_file: "+certFile+", key_file: "+keyFile+"}\n"), Options{})
	addr := strings.TrimPrefix(gwURL, "http://")
	send := func(body string) net.Conn {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool()})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		return c
	}
	// Two 7990-token requests hold 1000 of the 1045 blocks.
	var fillers []net.Conn
	for range 2 {
		fillers = append(fillers, send(`{"model":"llama-3-8b","prompt":"hi","max_tokens":7990}`))
	}
	eventually(t, "the budget to fill", func() bool { return held(gw) >= 1000*(2<<20) })
	c := send(`{"model":"llama-3-8b","prompt":"hi","max_tokens":1600}`)
	eventually(t, "the request to queue", func() bool { return queued(gw) == 1 })
	c.Close()
	eventually(t, "the queue to empty", func() bool { return queued(gw) == 0 })
	for _, f := range fillers {
		f.Close()
	}
	eventually(t, "all reservations to return", func() bool { return held(gw) == 0 })
}

// TestTLSBackendWrongCAHealth: with a CA that did not sign the backend's
// certificate, the health checks fail to connect, the circuit opens, and
// the gateway is not ready; /status shows why.
func TestTLSBackendWrongCAHealth(t *testing.T) {
	dir := t.TempDir()
	ca, other := testcerts.NewCA(t, "backend CA"), testcerts.NewCA(t, "other CA")
	otherFile := filepath.Join(dir, "other.pem")
	testcerts.WriteFile(t, otherFile, other.CertPEM)
	simURL := startTLSSim(t, ca.Server(t, "sim").TLS(t))
	s, gw := startGateway(t, withBackendTLS(baseConfig(simURL, ""), simURL, "{ca_file: "+otherFile+"}"), Options{})
	be := s.rt.Load().upstreams.Backends()[0]
	eventually(t, "the circuit to open", func() bool { return !be.Available() })
	if !strings.Contains(be.LastError(), "certificate signed by unknown authority") {
		t.Errorf("last error %q", be.LastError())
	}
	resp, err := httpClient.Get(gw + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("/readyz: %d; want 503", resp.StatusCode)
	}
}
