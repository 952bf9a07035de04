package gateway

import (
	"maps"
	"math"
	"net/url"
	"slices"
	"strings"
)

// TracingConfig exports a span per proxied request to an OpenTelemetry
// collector over OTLP/HTTP (trace.go). A reload may change any of it: the
// new exporter takes the requests that arrive after it, the old one flushes
// the spans of the requests that began under it, then stops.
type TracingConfig struct {
	// OTLPEndpoint is the collector's OTLP/HTTP URL, http:// or https://
	// (e.g. http://otel-collector:4318). A URL without a path is sent to
	// /v1/traces; a path given is used as it is. Default empty: no span is
	// made, and the client's traceparent and tracestate reach the backend
	// unchanged.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// ServiceName is the spans' service.name. Default kvgate.
	ServiceName string `yaml:"service_name"`
	// SampleRatio is the fraction of requests without a traceparent whose
	// spans are kept, in [0, 1]. A request with one follows its sampled
	// flag whatever the ratio: the client decided for the whole trace.
	// Default 1.
	SampleRatio *float64 `yaml:"sample_ratio"`
	// Headers are sent with every export, for a collector that wants
	// credentials (Authorization, an API key header). Default none. They
	// are never logged.
	Headers map[string]string `yaml:"headers"`
}

// defaultTracesPath is OTLP/HTTP's path for spans, where the endpoint
// gives none.
const defaultTracesPath = "/v1/traces"

// on says whether spans are exported.
func (t TracingConfig) on() bool { return t.OTLPEndpoint != "" }

// sampleRatio is the resolved sample_ratio.
func (t TracingConfig) sampleRatio() float64 { return *t.SampleRatio }

// endpointURL is the URL spans are posted to.
func (t TracingConfig) endpointURL() string {
	u, err := url.Parse(t.OTLPEndpoint)
	if err != nil {
		return t.OTLPEndpoint // validate refused it already
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = defaultTracesPath
	}
	return u.String()
}

func (t *TracingConfig) defaults() { fillDefaults("tracing", t) }

// validateTracing fills and checks the tracing section.
func (c *Config) validateTracing(p *problems) {
	t := &c.Tracing
	t.defaults()
	if t.OTLPEndpoint != "" {
		u, err := url.Parse(t.OTLPEndpoint)
		switch {
		case err != nil:
			p.bad("tracing.otlp_endpoint", "%q is not a URL", t.OTLPEndpoint)
		case u.Scheme != "http" && u.Scheme != "https":
			p.bad("tracing.otlp_endpoint", "%q is not an http:// or https:// URL (OTLP/HTTP; gRPC is not supported)", t.OTLPEndpoint)
		case u.Host == "":
			p.bad("tracing.otlp_endpoint", "%q names no host", t.OTLPEndpoint)
		case u.User != nil:
			// A URL is logged when the collector cannot be reached.
			p.bad("tracing.otlp_endpoint", "holds credentials: give them in tracing.headers, which are never logged")
		case u.RawQuery != "" || u.Fragment != "":
			p.bad("tracing.otlp_endpoint", "%q has a query or fragment, which OTLP/HTTP does not send", t.OTLPEndpoint)
		}
	}
	if strings.TrimSpace(t.ServiceName) != t.ServiceName {
		p.bad("tracing.service_name", "%q has spaces around it", t.ServiceName)
	}
	if r := *t.SampleRatio; math.IsNaN(r) || r < 0 || r > 1 {
		p.bad("tracing.sample_ratio", "%v is not in [0, 1]", r)
	}
	for _, k := range slices.Sorted(maps.Keys(t.Headers)) { // the same order every time
		f := "tracing.headers." + k
		if !validHeaderName(k) {
			p.bad(f, "not a valid HTTP header name")
		}
		if strings.ContainsAny(t.Headers[k], "\r\n\x00") {
			p.bad(f, "the value holds a line break or NUL")
		}
	}
}

// sameAs compares two resolved tracing sections.
func (t TracingConfig) sameAs(o TracingConfig) bool {
	return t.OTLPEndpoint == o.OTLPEndpoint && t.ServiceName == o.ServiceName &&
		t.sampleRatio() == o.sampleRatio() && maps.Equal(t.Headers, o.Headers)
}

// validHeaderName says whether s is an HTTP field name (RFC 9110 token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
