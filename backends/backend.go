package backends

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/admission"
)

// Spec is one backend as configured. Zero durations and counts take the
// defaults given on each field.
type Spec struct {
	Name   string
	URL    string   // http://host:port or https://host[:port] of the OpenAI-compatible server
	Models []string // served model names
	APIKey string   // sent upstream as a bearer token; "" = none
	// TLS configures an https:// URL; nil there = the system's roots, the
	// URL's host as server name, no client certificate. Refused with http://.
	TLS *TLSSpec

	HealthPath     string        // "" = /health
	HealthInterval time.Duration // 0 = 1s
	HealthTimeout  time.Duration // 0 = 2s
	FailThreshold  int           // consecutive failures that open the circuit; 0 = 3
	Cooldown       time.Duration // open circuit waits this long before half-open; 0 = 5s
	MetricsPath    string        // "" = /metrics; "-" = do not scrape
	ScrapeInterval time.Duration // 0 = 1s
	// FirstByteTimeout bounds the wait for a streamed answer's first event;
	// the gateway enforces it and reports misses (ReportTimeout). 0 = 60s.
	FirstByteTimeout time.Duration
	TokenizeTimeout  time.Duration // one /tokenize call; 0 = 2s
	// FinalUsageOnly: the server (or a proxy in front of it that validates
	// requests against OpenAI's API) refuses vLLM's
	// stream_options.continuous_usage_stats, so a stream asks it for the
	// final usage alone (include_usage). false: usage on every chunk too.
	FinalUsageOnly bool

	Upstream UpstreamOptions
}

// WithDefaults is s with every zero field set to its default, as a Backend
// made from s would use it.
func (s Spec) WithDefaults() Spec {
	s.fillDefaults()
	return s
}

// Defaults of a Spec's zero fields, as WithDefaults fills them.
const (
	DefaultHealthPath       = "/health"
	DefaultHealthInterval   = time.Second
	DefaultHealthTimeout    = 2 * time.Second
	DefaultFailThreshold    = 3
	DefaultCooldown         = 5 * time.Second
	DefaultMetricsPath      = "/metrics"
	DefaultScrapeInterval   = time.Second
	DefaultFirstByteTimeout = time.Minute
	DefaultTokenizeTimeout  = 2 * time.Second
	DefaultMaxConns         = 1024 // UpstreamOptions.MaxConns
)

func (s *Spec) fillDefaults() {
	if s.HealthPath == "" {
		s.HealthPath = DefaultHealthPath
	}
	if s.HealthInterval <= 0 {
		s.HealthInterval = DefaultHealthInterval
	}
	if s.HealthTimeout <= 0 {
		s.HealthTimeout = DefaultHealthTimeout
	}
	if s.FailThreshold <= 0 {
		s.FailThreshold = DefaultFailThreshold
	}
	if s.Cooldown <= 0 {
		s.Cooldown = DefaultCooldown
	}
	if s.MetricsPath == "" {
		s.MetricsPath = DefaultMetricsPath
	}
	if s.ScrapeInterval <= 0 {
		s.ScrapeInterval = DefaultScrapeInterval
	}
	if s.FirstByteTimeout <= 0 {
		s.FirstByteTimeout = DefaultFirstByteTimeout
	}
	if s.TokenizeTimeout <= 0 {
		s.TokenizeTimeout = DefaultTokenizeTimeout
	}
}

// Budget is what routing needs to know of a backend's admission budget.
type Budget interface {
	// Free is the capacity not held by admitted requests (may be negative
	// while a shrunk budget drains).
	Free() int64
}

// Backend is one upstream server.
type Backend struct {
	spec Spec
	host string // host:port
	auth string // the Authorization header for spec.APIKey; "" for none
	up   *Upstream
	// probe carries health checks and scrapes on connections of their own,
	// so a backend busy with traffic is not judged dead for want of a slot.
	probe  *Upstream
	budget Budget
	clock  admission.Clock
	circ   circuit

	kv        atomic.Pointer[KVReport]
	scrapeErr atomic.Pointer[string]
}

// NewBackend validates spec and makes a Backend whose admission budget is
// budget. clock times its circuit, its probes' interval and timeouts, and
// its /tokenize timeout (nil = the system clock).
func NewBackend(spec Spec, budget Budget, clock admission.Clock) (*Backend, error) {
	spec.fillDefaults()
	if spec.Name == "" {
		return nil, errors.New("backend: name is required")
	}
	u, err := url.Parse(spec.URL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("backend %s: url %q: want http://host:port or https://host[:port]", spec.Name, HideUserinfo(spec.URL))
	}
	if u.User != nil {
		// Never sent upstream, and the url is shown: a credential goes in
		// APIKey.
		return nil, fmt.Errorf("backend %s: url holds credentials (user:password@): give the backend's key as its api_key", spec.Name)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("backend %s: url %q: give the server root, without a path (the gateway forwards /v1/...)", spec.Name, spec.URL)
	}
	if len(spec.Models) == 0 {
		return nil, fmt.Errorf("backend %s: models: at least one model is required", spec.Name)
	}
	if budget == nil {
		return nil, fmt.Errorf("backend %s: no budget", spec.Name)
	}
	if clock == nil {
		clock = admission.SystemClock()
	}
	// Health checks, scrapes and /tokenize share the transport's TLS: a
	// probe that bypassed it would call healthy a backend no request can
	// reach.
	up, addr := spec.Upstream, u.Host
	switch {
	case u.Scheme == "https":
		if up.TLS, err = spec.TLS.clientConfig(u.Hostname()); err != nil {
			return nil, fmt.Errorf("backend %s: tls: %w", spec.Name, err)
		}
		addr = fasthttp.AddMissingPort(addr, true)
	case spec.TLS != nil:
		return nil, fmt.Errorf("backend %s: tls: given for url %q, which is not https://", spec.Name, spec.URL) // no userinfo: refused above
	}
	b := &Backend{spec: spec, host: u.Host, up: NewUpstream(addr, up),
		probe:  NewUpstream(addr, UpstreamOptions{MaxConns: 2, DialTimeout: up.DialTimeout, TLS: up.TLS, DialForTesting: up.DialForTesting}),
		budget: budget, clock: clock}
	if spec.APIKey != "" {
		b.auth = "Bearer " + spec.APIKey
	}
	b.circ = circuit{threshold: spec.FailThreshold, cooldown: spec.Cooldown, now: clock.Now}
	return b, nil
}

// userinfo is a URL's user:password@.
var userinfo = regexp.MustCompile(`(://)[^/?#\s]*@`)

// HideUserinfo hides a url's user:password@ in an error about it, even
// where url.Parse refuses the url.
func HideUserinfo(u string) string { return userinfo.ReplaceAllString(u, "${1}***@") }

// Name is the configured name.
func (b *Backend) Name() string { return b.spec.Name }

// Addr is the host:port requests are sent to, as the url gave it: the
// operator's (the access log's upstream_addr), never a client's to see.
func (b *Backend) Addr() string { return b.host }

// Spec is the configuration the backend was made from, defaults filled.
func (b *Backend) Spec() Spec { return b.spec }

// Serves says whether the backend serves model.
func (b *Backend) Serves(model string) bool { return slices.Contains(b.spec.Models, model) }

// Budget is the admission budget the backend draws from (shared by
// backends on the same GPU).
func (b *Backend) Budget() Budget { return b.budget }

// State is the backend's circuit state.
func (b *Backend) State() CircuitState { return b.circ.state() }

// Available says whether requests may be routed to the backend: its circuit
// is closed or half-open.
func (b *Backend) Available() bool { return b.circ.state() != StateOpen }

// LastError is the last failure recorded against the backend, "" when
// healthy.
func (b *Backend) LastError() string {
	b.circ.mu.Lock()
	defer b.circ.mu.Unlock()
	return b.circ.lastErr
}

// KV is the latest KV report, if any has been scraped.
func (b *Backend) KV() (KVReport, bool) {
	if r := b.kv.Load(); r != nil {
		return *r, true
	}
	return KVReport{}, false
}

// ReportSuccess and ReportFailure feed the circuit from outside, as a
// passed or failed probe would.
func (b *Backend) ReportSuccess() { b.circ.success() }

// ReportFailure records a failure; it reports whether the circuit opened.
func (b *Backend) ReportFailure(err error) bool { return b.circ.failure(err) }

// ReportTimeout records a request whose first byte did not arrive within
// its timeout; threshold of them in a row open the circuit, which only an
// answered request (ReportAnswered) closes again. It reports whether the
// circuit opened.
func (b *Backend) ReportTimeout(err error) bool { return b.circ.timeout(err) }

// ReportAnswered records a request whose first byte arrived.
func (b *Backend) ReportAnswered() { b.circ.answered() }

// NewRequest prepares a request to path on the backend, with the backend's
// own credentials.
func (b *Backend) NewRequest(req *fasthttp.Request, method, path string) {
	req.Header.SetMethod(method)
	// Origin-form with Host, as a proxy sends it (RFC 9112 §3.2.1): the
	// absolute form is for requests to a proxy, and fasthttp writes a URI
	// given whole as it is.
	req.SetRequestURI(path)
	req.Header.SetHost(b.host)
	if b.auth != "" {
		req.Header.Set("Authorization", b.auth)
	} else {
		req.Header.Del("Authorization")
	}
}

// Error is a failure talking to one backend. Its text carries the
// transport's detail, addresses included: for logs, not for clients.
type Error struct {
	Backend string
	Err     error
}

func (e *Error) Error() string { return "backend " + e.Backend + ": " + e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

// Do forwards req (prepared with NewRequest) and returns the response once
// its headers have arrived. Only a failure to connect counts against the
// circuit: a write that fails while sending the body (the backend refused
// it), a reset, or the backend's own error status belong to the request,
// and one client must not take the backend away from everyone. A backend
// that dies is caught by its health checks; one that hangs, by its
// requests' first-byte timeouts (ReportTimeout).
func (b *Backend) Do(ctx context.Context, req *fasthttp.Request) (*Response, error) {
	r, err := b.up.Do(ctx, req)
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, ErrConnect) {
			b.circ.failure(err)
		}
		return nil, &Error{Backend: b.spec.Name, Err: err}
	}
	return r, nil
}

// MaxBody is the largest non-streamed response the backend's transport reads.
func (b *Backend) MaxBody() int64 { return b.up.MaxBody() }

// FirstByteTimeout is how long a streamed request may wait for its first
// event.
func (b *Backend) FirstByteTimeout() time.Duration { return b.spec.FirstByteTimeout }

// FinalUsageOnly says whether a stream may ask this backend for its final
// usage only (Spec.FinalUsageOnly).
func (b *Backend) FinalUsageOnly() bool { return b.spec.FinalUsageOnly }

// ErrTokenizeTimeout is a /tokenize call that outlived the backend's
// TokenizeTimeout.
var ErrTokenizeTimeout = errors.New("tokenize timed out")

// Tokenize asks the backend's /tokenize (vLLM's API) how many tokens body
// holds; body is a /tokenize request ({"model", "prompt"} or {"model",
// "messages"}). It gives up after the spec's TokenizeTimeout
// (ErrTokenizeTimeout): a slow tokenizer must not hold requests back when
// an estimate can stand in.
func (b *Backend) Tokenize(ctx context.Context, body []byte) (int, error) {
	return b.TokenizeIDs(ctx, body, nil)
}

// TokenizeIDs is Tokenize that also reads the prompt's token ids into *ids
// (reusing its capacity) when ids is not nil: what the backend's prefix
// cache tells blocks apart by.
func (b *Backend) TokenizeIDs(ctx context.Context, body []byte, ids *[]uint32) (int, error) {
	ctx, cancel := b.withTimeout(ctx, b.spec.TokenizeTimeout, ErrTokenizeTimeout)
	defer cancel()
	n, err := b.tokenize(ctx, body, ids)
	if err != nil && errors.Is(context.Cause(ctx), ErrTokenizeTimeout) {
		return 0, fmt.Errorf("backend %s: %w after %s", b.spec.Name, ErrTokenizeTimeout, b.spec.TokenizeTimeout)
	}
	return n, err
}

// StatusError is a backend's non-2xx answer to a request the gateway made
// for itself (not a proxied one, whose status is passed through).
type StatusError struct {
	Backend string
	Status  int
	Body    []byte
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("backend %s: status %d: %s", e.Backend, e.Status, bytes.TrimSpace(e.Body[:min(len(e.Body), 200)]))
}

// Probe runs one health check and, unless scraping is off, one metrics
// scrape, updating the circuit and the KV report. It returns the report
// when one was scraped.
func (b *Backend) Probe(ctx context.Context) (KVReport, bool) {
	if err := b.checkHealth(ctx); err != nil {
		b.circ.failure(err)
	} else {
		b.circ.success()
	}
	if b.spec.MetricsPath == "-" {
		return KVReport{}, false
	}
	return b.Scrape(ctx)
}

// withTimeout is context.WithTimeoutCause on the backend's clock. Only its
// cause tells the timeout apart (Err says Canceled): the exchange reads
// context.Cause, as WithTimeout's DeadlineExceeded would be read.
func (b *Backend) withTimeout(ctx context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := b.clock.AfterFunc(d, func() { cancel(cause) })
	return ctx, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

func (b *Backend) get(ctx context.Context, path string, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := b.withTimeout(ctx, timeout, context.DeadlineExceeded)
	defer cancel()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	b.NewRequest(req, fasthttp.MethodGet, path)
	r, err := b.probe.Do(ctx, req)
	if err != nil {
		return 0, nil, err
	}
	defer r.Release()
	data, err := r.ReadAll(16 << 20)
	return r.Status(), data, err
}

func (b *Backend) checkHealth(ctx context.Context) error {
	status, _, err := b.get(ctx, b.spec.HealthPath, b.spec.HealthTimeout)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	if status != fasthttp.StatusOK {
		return fmt.Errorf("health: status %d", status)
	}
	return nil
}

// Scrape reads the backend's /metrics once.
func (b *Backend) Scrape(ctx context.Context) (KVReport, bool) {
	status, data, err := b.get(ctx, b.spec.MetricsPath, b.spec.HealthTimeout)
	if err == nil && status != fasthttp.StatusOK {
		err = fmt.Errorf("status %d", status)
	}
	var r KVReport
	if err == nil {
		r, err = ParseMetrics(bytes.NewReader(data), b.clock.Now())
	}
	if err != nil {
		msg := fmt.Sprintf("scrape %s: %v", b.spec.MetricsPath, err)
		b.scrapeErr.Store(&msg)
		return KVReport{}, false
	}
	b.scrapeErr.Store(nil)
	b.kv.Store(&r)
	return r, true
}
