package gateway

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/kvgate/kvgate/kvbudget"
)

// ServerConfig holds the HTTP server's limits.
type ServerConfig struct {
	// MaxBodyBytes is the largest request body accepted (413 beyond). Default 8MiB.
	MaxBodyBytes Size `yaml:"max_body_bytes"`
	// MaxHeaderBytes bounds a request's line and headers together (431
	// beyond). Default 16KiB; at least 1KiB.
	MaxHeaderBytes Size `yaml:"max_header_bytes"`
	// MaxSSELineBytes bounds one line of a backend's event stream; a longer
	// line ends the stream with an error event, so a runaway backend cannot
	// grow the gateway's memory. Default 4MiB; at least 64KiB.
	MaxSSELineBytes Size `yaml:"max_sse_line_bytes"`
	// ReadTimeout bounds reading one request, headers and body. Default 30s.
	ReadTimeout Duration `yaml:"read_timeout"`
	// WriteTimeout bounds writing one response, a whole stream included.
	// Default: RequestTimeout plus a minute.
	WriteTimeout Duration `yaml:"write_timeout"`
	// IdleTimeout closes keep-alive connections idle this long. Default 2m.
	IdleTimeout Duration `yaml:"idle_timeout"`
	// MaxConnections caps concurrent client connections. Default 10000.
	// Past it a request gets a 503 with Retry-After and its connection is
	// closed; probes (/healthz, /readyz) are still answered.
	MaxConnections int `yaml:"max_connections"`
	// RequestTimeout bounds a request from arrival to its last byte,
	// queueing included; past it the client gets 504. Default 10m.
	RequestTimeout Duration `yaml:"request_timeout"`
	// ShutdownTimeout is how long SIGTERM waits for in-flight requests,
	// once drain_delay is over. Default 30s.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
	// DrainDelay is how long the gateway serves on after SIGTERM while
	// /readyz answers 503, so that load balancers and Kubernetes endpoints
	// stop sending before the listener closes. Default 5s; 0s: the
	// listener closes at once.
	DrainDelay Duration `yaml:"drain_delay"`
	// CORS lets browser pages of the listed origins call the gateway
	// (preflights answered, answers readable). Default: off.
	CORS *CORSConfig `yaml:"cors"`
	// TLS serves HTTPS instead of HTTP (listener_tls.go); its files are
	// read again on every reload. Default: plain HTTP. Turning it on or off
	// needs a restart.
	TLS *ServerTLSConfig `yaml:"tls"`
}

// defaults fills every server limit left out (configdefaults.go), then
// write_timeout from request_timeout.
func (s *ServerConfig) defaults() {
	fillDefaults("server", s)
	if s.WriteTimeout.D == 0 {
		s.WriteTimeout.D = s.RequestTimeout.D + defaultWriteSlack
	}
}

// validateServer checks listen and fills and checks the server section.
func (c *Config) validateServer(p *problems) {
	if c.Server.CORS != nil {
		c.Server.CORS.validate("server.cors", p.bad)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		p.bad("listen", "%q is not host:port", c.Listen)
	}
	s := &c.Server
	// write_timeout's check is of what the file asked for: its default
	// always passes it.
	writeGiven := s.WriteTimeout.D
	s.defaults()
	p.size("server.max_body_bytes", s.MaxBodyBytes)
	p.size("server.max_header_bytes", s.MaxHeaderBytes)
	if s.MaxHeaderBytes.Bytes < 1<<10 || s.MaxHeaderBytes.Bytes > 1<<30 {
		p.bad("server.max_header_bytes", "%s is not in [1KiB, 1GiB]", kvbudget.FormatBytes(s.MaxHeaderBytes.Bytes))
	}
	p.size("server.max_sse_line_bytes", s.MaxSSELineBytes)
	if s.MaxSSELineBytes.Bytes < 64<<10 || s.MaxSSELineBytes.Bytes > 1<<30 {
		p.bad("server.max_sse_line_bytes", "%s is not in [64KiB, 1GiB]", kvbudget.FormatBytes(s.MaxSSELineBytes.Bytes))
	}
	p.dur("server.read_timeout", s.ReadTimeout)
	p.dur("server.write_timeout", s.WriteTimeout)
	p.dur("server.idle_timeout", s.IdleTimeout)
	p.dur("server.request_timeout", s.RequestTimeout)
	p.dur("server.shutdown_timeout", s.ShutdownTimeout)
	p.dur("server.drain_delay", s.DrainDelay)
	if s.MaxConnections < 0 {
		p.bad("server.max_connections", "must be >= 0 (0 = %d)", defaultOf[int]("server.max_connections"))
	}
	if writeGiven != 0 && writeGiven < s.RequestTimeout.D {
		p.bad("server.write_timeout", "%s is shorter than server.request_timeout (%s): streams would be cut before they may end", writeGiven, s.RequestTimeout.D)
	}
}

// sameAs compares the resolved limits of two server sections.
func (s ServerConfig) sameAs(o ServerConfig) bool {
	return s.MaxBodyBytes.Bytes == o.MaxBodyBytes.Bytes && s.MaxHeaderBytes.Bytes == o.MaxHeaderBytes.Bytes &&
		s.MaxSSELineBytes.Bytes == o.MaxSSELineBytes.Bytes && s.ReadTimeout.D == o.ReadTimeout.D && s.WriteTimeout.D == o.WriteTimeout.D &&
		s.IdleTimeout.D == o.IdleTimeout.D && s.MaxConnections == o.MaxConnections && s.RequestTimeout.D == o.RequestTimeout.D &&
		s.ShutdownTimeout.D == o.ShutdownTimeout.D && s.DrainDelay.D == o.DrainDelay.D
}

// DrainTimeout is how long a shutdown waits for in-flight requests
// (server.shutdown_timeout).
func (s ServerConfig) DrainTimeout() time.Duration { return s.ShutdownTimeout.D }

// CORSConfig is server.cors.
type CORSConfig struct {
	// AllowedOrigins are the origins (scheme://host[:port]) whose pages may
	// call the gateway, or "*" for any. Required.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// AllowedMethods a preflight may ask for. Default GET, POST, OPTIONS.
	AllowedMethods []string `yaml:"allowed_methods"`
	// AllowedHeaders a preflight may ask for, or "*" for any; a trailing *
	// is a prefix. Default Authorization, Content-Type, X-Request-Id, the
	// OpenAI SDKs' own (OpenAI-Organization, OpenAI-Project, X-Stainless-*)
	// and the default priority and session headers.
	AllowedHeaders []string `yaml:"allowed_headers"`
}

// validate checks c (field is its config path) and fills its defaults.
func (c *CORSConfig) validate(field string, bad func(field, format string, a ...any)) {
	if len(c.AllowedOrigins) == 0 {
		bad(field+".allowed_origins", "list at least one origin (scheme://host[:port]) or \"*\"")
	}
	for i, o := range c.AllowedOrigins {
		if o == "*" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			bad(fmt.Sprintf("%s.allowed_origins[%d]", field, i), "%q is not an origin: want scheme://host[:port], no path, or \"*\"", o)
		}
		c.AllowedOrigins[i] = strings.TrimSuffix(o, "/")
	}
	if len(c.AllowedMethods) == 0 {
		c.AllowedMethods = defaultCORSMethods
	}
	for i, m := range c.AllowedMethods {
		if m == "" || strings.ContainsAny(m, " ,") {
			bad(fmt.Sprintf("%s.allowed_methods[%d]", field, i), "%q is not an HTTP method", m)
		}
		c.AllowedMethods[i] = strings.ToUpper(m)
	}
	if len(c.AllowedHeaders) == 0 {
		c.AllowedHeaders = defaultCORSHeaders
	}
}
