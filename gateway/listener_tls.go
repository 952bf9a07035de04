package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"sync/atomic"

	"github.com/kvgate/kvgate/backends"
)

// ServerTLSConfig serves the gateway over TLS, 1.2 or later. A reload
// (SIGHUP) reads the files again and new connections get what they hold;
// files that fail to load fail the reload, and the running certificate
// stays.
type ServerTLSConfig struct {
	// CertFile and KeyFile are the certificate (chain) and its key, PEM,
	// relative to this file. Both required.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile, when given, holds the PEM certificates that may sign
	// clients' certificates: every client must then present one that
	// verifies, or its handshake is refused. Default: none asked for.
	ClientCAFile string `yaml:"client_ca_file"`

	// cert and clientCAs are the files' contents, parsed by validate.
	cert      *tls.Certificate
	clientCAs *x509.CertPool
}

// validateServerTLS reads and parses server.tls's files, reporting each
// problem by its field.
func (c *Config) validateServerTLS(bad func(field, format string, a ...any)) {
	t := c.Server.TLS
	if t == nil {
		return
	}
	read := c.fileReader(bad)
	const f = "server.tls"
	switch {
	case t.CertFile == "":
		bad(f+".cert_file", "required (the server's certificate, PEM)")
	case t.KeyFile == "":
		bad(f+".key_file", "required (the server's key, PEM)")
	default:
		cert, key := read(f+".cert_file", t.CertFile), read(f+".key_file", t.KeyFile)
		if cert != nil && key != nil {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				bad(f+".cert_file", "%s with key_file %s: %v", t.CertFile, t.KeyFile, err)
			} else {
				t.cert = &pair
			}
		}
	}
	if t.ClientCAFile != "" {
		if data := read(f+".client_ca_file", t.ClientCAFile); data != nil {
			pool, err := backends.ParseCertPool(data)
			if err != nil {
				bad(f+".client_ca_file", "%s: %v", t.ClientCAFile, err)
			}
			t.clientCAs = pool
		}
	}
}

// serverConfig is what one load of the files serves. TLS 1.2 is the
// floor: older versions have known breaks, and every client the gateway
// serves (the OpenAI SDKs, curl, browsers) speaks 1.2 or later. fasthttp
// speaks HTTP/1.1 only, hence the one protocol offered.
func (t *ServerTLSConfig) serverConfig() *tls.Config {
	c := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{*t.cert},
		NextProtos:   []string{"http/1.1"},
	}
	if t.clientCAs != nil {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = t.clientCAs
	}
	return c
}

// listenerTLS is the listener's TLS, swapped whole by a reload: the
// certificate pair and the client CAs of the latest good load, read by
// every new handshake. Connections already open keep what they agreed on.
type listenerTLS struct {
	cur atomic.Pointer[tls.Config]
}

func newListenerTLS(t *ServerTLSConfig) *listenerTLS {
	l := &listenerTLS{}
	l.set(t)
	return l
}

// set serves t from the next handshake on.
func (l *listenerTLS) set(t *ServerTLSConfig) { l.cur.Store(t.serverConfig()) }

// leaf is the certificate served now, for the log.
func (l *listenerTLS) leaf() *x509.Certificate {
	c := l.cur.Load().Certificates[0]
	if c.Leaf != nil {
		return c.Leaf
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return &x509.Certificate{} // X509KeyPair parsed it once already
	}
	return leaf
}

// wrap serves ln over TLS. Each handshake asks for the current config, so a
// reload needs no new listener (which would drop the port for a moment).
func (l *listenerTLS) wrap(ln net.Listener) net.Listener {
	return tls.NewListener(ln, &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return l.cur.Load(), nil
		},
	})
}

// socketOf is the TCP connection beneath c: the hang-up watch asks the
// kernel about the socket, which a TLS connection does not expose itself.
func socketOf(c net.Conn) net.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return c
}
