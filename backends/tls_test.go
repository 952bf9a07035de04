package backends

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/internal/testcerts"
)

// serveTLS runs a fasthttp server answering every path with 200 "ok:PATH"
// behind TLS with cfg, on a loopback port.
func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		fmt.Fprintf(ctx, "ok:%s", ctx.Path())
	}, CloseOnShutdown: true}
	return serveOn(t, tls.NewListener(ln, cfg), srv)
}

// TestTLSBackend reaches a backend over TLS through every path the
// gateway uses (a forwarded request, a health probe), and checks that a
// handshake that fails is a failure to connect, named after the backend,
// which the circuit counts.
func TestTLSBackend(t *testing.T) {
	ca, other := testcerts.NewCA(t, "backend CA"), testcerts.NewCA(t, "some other CA")
	clientCA := testcerts.NewCA(t, "client CA")
	serverCert := ca.Server(t, "backend").TLS(t)
	plain := serveTLS(t, &tls.Config{Certificates: []tls.Certificate{serverCert}})
	mutual := serveTLS(t, &tls.Config{Certificates: []tls.Certificate{serverCert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCA.Pool()})
	client := clientCA.Client(t, "gateway")

	tests := []struct {
		name string
		addr string
		tls  *TLSSpec
		// wantErr is "" for success; else a part of the error, which must
		// be ErrTLS within ErrConnect when connect is set.
		wantErr string
		connect bool
	}{
		{name: "trusted CA", addr: plain, tls: &TLSSpec{CAPEM: ca.CertPEM}},
		{name: "server name given", addr: plain, tls: &TLSSpec{CAPEM: ca.CertPEM, ServerName: "localhost"}},
		{name: "wrong CA", addr: plain, tls: &TLSSpec{CAPEM: other.CertPEM}, wantErr: "certificate signed by unknown authority", connect: true},
		{name: "system roots", addr: plain, tls: nil, wantErr: "x509", connect: true},
		{name: "wrong server name", addr: plain, tls: &TLSSpec{CAPEM: ca.CertPEM, ServerName: "vllm.example"}, wantErr: "vllm.example", connect: true},
		{name: "insecure skip verify", addr: plain, tls: &TLSSpec{CAPEM: other.CertPEM, InsecureSkipVerify: true}},
		{name: "client certificate", addr: mutual, tls: &TLSSpec{CAPEM: ca.CertPEM, CertPEM: client.CertPEM, KeyPEM: client.KeyPEM}},
		// TLS 1.3 ends the client's side of the handshake before the
		// server has judged its certificate: the refusal arrives instead of
		// the answer (an alert, or only the closed connection), as the
		// request's own failure; the health probes then open the circuit.
		{name: "client certificate missing", addr: mutual, tls: &TLSSpec{CAPEM: ca.CertPEM}, wantErr: "read response"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be, err := NewBackend(Spec{Name: "tls0", URL: "https://" + tt.addr, Models: []string{"m"}, TLS: tt.tls,
				FailThreshold: 1, MetricsPath: "-"}, budgetOf(1), newClock())
			if err != nil {
				t.Fatal(err)
			}
			req := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(req)
			be.NewRequest(req, fasthttp.MethodPost, "/v1/completions")
			req.SetBodyString(`{}`)
			r, err := be.Do(context.Background(), req)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Do: %v", err)
				}
				body, err := r.ReadAll(1 << 20)
				r.Release()
				if err != nil || string(body) != "ok:/v1/completions" {
					t.Fatalf("body %q, %v", body, err)
				}
				be.Probe(context.Background())
				if be.State() != StateClosed {
					t.Fatalf("health probe over TLS failed: %s (%s)", be.State(), be.LastError())
				}
				return
			}
			if err == nil {
				r.Release()
				t.Fatal("Do succeeded; want an error")
			}
			if !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "backend tls0: ") {
				t.Fatalf("error %q: want it to name the backend and say %q", err, tt.wantErr)
			}
			if !tt.connect {
				be.Probe(context.Background())
				if be.State() != StateOpen {
					t.Fatalf("circuit %s after a failed health probe", be.State())
				}
				return
			}
			if !errors.Is(err, ErrTLS) || !errors.Is(err, ErrConnect) {
				t.Fatalf("error %q is not ErrTLS within ErrConnect", err)
			}
			if be.State() != StateOpen || !strings.Contains(be.LastError(), tt.wantErr) {
				t.Fatalf("circuit %s, last error %q: a failed handshake must count as a failure to connect", be.State(), be.LastError())
			}
		})
	}
}

// TestPEMDoesNotPrint pins that a Spec printed whole shows no key.
func TestPEMDoesNotPrint(t *testing.T) {
	s := Spec{TLS: &TLSSpec{KeyPEM: PEM("-----BEGIN PRIVATE KEY-----secret")}}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		if out := fmt.Sprintf(verb, *s.TLS); strings.Contains(out, "secret") {
			t.Errorf("%s printed the key: %s", verb, out)
		}
	}
}
