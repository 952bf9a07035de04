package gateway

import (
	"crypto/tls"
	"fmt"
	"net/url"
	"os"

	"github.com/kvgate/kvgate/backends"
)

// BackendTLSConfig is how the gateway talks TLS to an https:// backend.
// TLS 1.2 is the floor.
type BackendTLSConfig struct {
	// CAFile holds the PEM certificates that may sign the backend's,
	// relative to this file. Default: the system's roots.
	CAFile string `yaml:"ca_file"`
	// ServerName is the name the backend's certificate must carry, also
	// sent as SNI. Default: the url's host.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any certificate: the traffic is encrypted
	// but the backend is not authenticated. Default false.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
	// CertFile and KeyFile are the gateway's client certificate and key
	// (PEM), for a backend that requires one: both or neither. Default none.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`

	// spec is the files' contents, read and checked by validate.
	spec backends.TLSSpec
}

// validateBackendTLS checks every backend's url scheme against its tls
// section and reads the section's files, reporting each problem by its
// field.
func (c *Config) validateBackendTLS(bad func(field, format string, a ...any)) {
	read := c.fileReader(bad)
	for i := range c.Backends {
		b := &c.Backends[i]
		f := fmt.Sprintf("backends[%d]", i)
		u, err := url.Parse(b.URL)
		if b.URL != "" && (err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https")) {
			bad(f+".url", "%q: want http://host:port or https://host[:port]", backends.HideUserinfo(b.URL))
			continue
		}
		if u != nil && u.User != nil {
			// Refused rather than sent as Basic auth: the url is shown on
			// /status and in logs, and a credential belongs in a field that
			// never is.
			bad(f+".url", "holds credentials (user:password@): give the backend's key in %s.api_key, sent as a bearer token and never shown", f)
			continue
		}
		t := b.TLS
		if t == nil {
			continue
		}
		if u.Scheme != "https" {
			bad(f+".tls", "given for url %q, which is not https://", backends.HideUserinfo(b.URL))
			continue
		}
		t.spec = backends.TLSSpec{ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
		if t.CAFile != "" {
			if data := read(f+".tls.ca_file", t.CAFile); data != nil {
				if _, err := backends.ParseCertPool(data); err != nil {
					bad(f+".tls.ca_file", "%s: %v", t.CAFile, err)
				}
				t.spec.CAPEM = data
			}
		}
		switch {
		case t.CertFile == "" && t.KeyFile == "":
		case t.CertFile == "":
			bad(f+".tls.cert_file", "required with key_file (both or neither)")
		case t.KeyFile == "":
			bad(f+".tls.key_file", "required with cert_file (both or neither)")
		default:
			cert, key := read(f+".tls.cert_file", t.CertFile), read(f+".tls.key_file", t.KeyFile)
			if cert != nil && key != nil {
				if _, err := tls.X509KeyPair(cert, key); err != nil {
					bad(f+".tls.cert_file", "%s with key_file %s: %v", t.CertFile, t.KeyFile, err)
				}
				t.spec.CertPEM, t.spec.KeyPEM = cert, key
			}
		}
	}
}

// fileReader reads a file named in the config, relative to it; a failure
// is reported against field and gives nil.
func (c *Config) fileReader(bad func(field, format string, a ...any)) func(field, path string) []byte {
	return func(field, path string) []byte {
		data, err := os.ReadFile(c.Path(path))
		if err != nil {
			bad(field, "%v", err)
			return nil
		}
		return data
	}
}

// tlsSpec is the backend's TLS as the backends package takes it; nil
// without a tls section.
func (b BackendConfig) tlsSpec() *backends.TLSSpec {
	if b.TLS == nil {
		return nil
	}
	s := b.TLS.spec
	return &s
}
