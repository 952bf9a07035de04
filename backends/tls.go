package backends

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"
)

// TLSSpec is how the gateway talks TLS to an https:// backend. It holds the
// PEM contents, not file names, so that a reload whose files changed on
// disk gives a Spec that differs, and with it a Backend with fresh
// connections under the new certificates.
type TLSSpec struct {
	// CAPEM are the certificates that may sign the backend's; none = the
	// system's roots.
	CAPEM PEM
	// ServerName is checked against the backend's certificate and sent as
	// SNI; "" = the URL's host.
	ServerName string
	// InsecureSkipVerify accepts any certificate the backend shows. For
	// tests and trusted networks only; default false.
	InsecureSkipVerify bool
	// CertPEM and KeyPEM are the gateway's client certificate, both or
	// neither.
	CertPEM PEM
	KeyPEM  PEM
}

// PEM is PEM-encoded material. It prints as its length only: a key must
// not reach a log through a Spec printed whole.
type PEM []byte

func (p PEM) String() string { return fmt.Sprintf("[%d bytes of PEM]", len(p)) }

// GoString keeps %#v as quiet as %v.
func (p PEM) GoString() string { return p.String() }

// ErrTLS marks, within ErrConnect, a TLS handshake with a backend that
// failed: a certificate not trusted, a name that does not match, a client
// certificate refused. The backend is not reachable as configured, which
// says something about it (or its configuration) alone.
var ErrTLS = errors.New("TLS handshake failed")

// ParseCertPool reads every certificate of a PEM bundle; a bundle with none
// is an error, not an empty pool that would trust nothing.
func ParseCertPool(data []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New("no PEM certificate found")
	}
	return pool, nil
}

// clientConfig is the tls.Config for a backend whose server name is host
// unless the spec names one; a nil spec takes every default. TLS 1.2 is the
// floor: older versions have known breaks, and every Python a vLLM runs on
// speaks 1.2 or later.
func (t *TLSSpec) clientConfig(host string) (*tls.Config, error) {
	if t == nil {
		t = &TLSSpec{}
	}
	c := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // opt-in, documented as unsafe
		// The upstream speaks HTTP/1.1 on its own connections.
		NextProtos: []string{"http/1.1"},
	}
	if c.ServerName == "" {
		c.ServerName = host
	}
	if len(t.CAPEM) > 0 {
		pool, err := ParseCertPool(t.CAPEM)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		c.RootCAs = pool
	}
	switch {
	case len(t.CertPEM) > 0 && len(t.KeyPEM) > 0:
		pair, err := tls.X509KeyPair(t.CertPEM, t.KeyPEM)
		if err != nil {
			return nil, fmt.Errorf("cert_file, key_file: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	case len(t.CertPEM) > 0 || len(t.KeyPEM) > 0:
		return nil, errors.New("cert_file and key_file go together: give both or neither")
	}
	return c, nil
}

// tlsDial wraps dial with a TLS handshake completed before the connection
// is handed to the pool. fasthttp's HostClient can do TLS itself (IsTLS),
// but without a write timeout it returns the connection before the
// handshake, which then runs inside the first request's write: a bad
// certificate would surface as a failed write (a request's own failure,
// which the circuit ignores) rather than as a failure to connect, and the
// handshake would be bounded by nothing. The returned connection keeps the
// socket's descriptor, so a pooled connection is still checked for a
// backend hang-up before reuse.
func tlsDial(dial func(string) (net.Conn, error), cfg *tls.Config, timeout time.Duration) func(string) (net.Conn, error) {
	return func(addr string) (net.Conn, error) {
		raw, err := dial(addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(raw, cfg)
		// Wall time, as the dial's before it (net.Dialer.Timeout): both bound
		// the network's part of connecting, which no clock of ours drives.
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, fmt.Errorf("%w: %w", ErrTLS, err)
		}
		return withFD(tc, raw), nil
	}
}
