package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/fleet"
	"github.com/kvgate/kvgate/kvbudget"
)

// Config is the gateway's one YAML file. Every field documents its default
// (what an absent or zero value means); Load fills the defaults and rejects
// bad values with the field's path in the message. The README's
// configuration reference is the operators' version of this.
type Config struct {
	// Listen is the address to serve on. Default 127.0.0.1:8080. A reload
	// cannot change it.
	Listen    string          `yaml:"listen"`
	Server    ServerConfig    `yaml:"server"`
	Admission AdmissionConfig `yaml:"admission"`
	// Tenants map API keys to tenants. With none configured every request is
	// anonymous and no key is checked.
	Tenants  []TenantConfig  `yaml:"tenants"`
	Models   []ModelConfig   `yaml:"models"`
	Backends []BackendConfig `yaml:"backends"`
	// Routing chooses among the GPUs that have room for a request:
	// least_loaded (the most room left after it) or affinity (the GPU its
	// session or prompt prefix hashes to, where the backend's prefix cache
	// has it, when that GPU has room; else the least loaded). Default
	// least_loaded.
	Routing string `yaml:"routing"`
	// SessionHeader carries a client's session key for affinity routing;
	// without it the request's user field, else a hash of its prompt's
	// beginning, is the key. Default X-Session-Id.
	SessionHeader string    `yaml:"session_header"`
	Log           LogConfig `yaml:"log"`
	// Admin guards the operators' views. A reload may change it.
	Admin AdminConfig `yaml:"admin"`
	// SharedBudget shares each GPU's budget with other gateway replicas
	// through Redis (package fleet). Default: none, the budget is this
	// process's alone.
	SharedBudget *fleet.Config `yaml:"shared_budget"`

	// dir is the directory of the file, against which relative paths resolve.
	dir string
}

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

// Admission modes (AdmissionConfig.Mode).
const (
	modeKV    = "kv"    // admit by predicted KV bytes against each GPU's budget
	modeCount = "count" // admit up to max_concurrency requests per backend, as a plain concurrency limit does
)

// Routing policies (Config.Routing).
const (
	routingLeastLoaded = "least_loaded"
	routingAffinity    = "affinity"
)

// AdmissionConfig is the KV budget policy.
type AdmissionConfig struct {
	// Mode is kv (requests are admitted by their KV bytes against each
	// GPU's budget) or count (at most max_concurrency requests per backend,
	// whatever their size: the fixed limit a plain proxy gives, kept for
	// comparison). Default kv.
	Mode string `yaml:"mode"`
	// MaxConcurrency is each backend's limit in count mode (a backend may
	// set its own). Default 16.
	MaxConcurrency int `yaml:"max_concurrency"`
	// Reservation is how much a running request is taken to hold:
	// predicted (its prompt and what it has generated, plus its growth as
	// forecast from the output lengths this model's requests really had, so
	// that the batch's future peak stays within the budget but with
	// probability epsilon) or worst_case (prompt + max_tokens from
	// admission to release: overflow is impossible, most of the pool stays
	// reserved but empty). Default worst_case: predicted never overflows
	// either (the guard), but when outputs turn long abruptly it stops a
	// share of the streams admitted on the old forecast, above what the
	// default may cost (see the README's "Choosing a reservation policy").
	Reservation string `yaml:"reservation"`
	// Epsilon bounds the probability that a GPU's real KV use passes its
	// budget, per admission, under predicted. In (0, 0.5). Default 1e-4.
	Epsilon float64 `yaml:"epsilon"`
	// WarmupSamples is how many finished sequences a model (or a tenant of
	// it) must have before its requests are predicted; until then they are
	// held at their worst case. Default 100; negative: from the first.
	WarmupSamples int `yaml:"warmup_samples"`
	// Headroom: while a backend reports more than (1 − headroom) × its
	// budget in use, nothing new is admitted to its GPU on the forecast
	// alone (predicted only; a request whose worst case fits beside
	// everything held still is).
	// In [0, 0.5); 0 disables the gate. Default 0.02.
	Headroom *float64 `yaml:"headroom"`
	// MaxOvercommit bounds what a wrong forecast can cost (predicted
	// only): the worst cases (prompt + max_tokens) of the requests admitted
	// to a GPU never sum past max_overcommit × its budget, nor a tenant's
	// past that times its share. >= 1. Default 4.
	MaxOvercommit float64 `yaml:"max_overcommit"`
	// CoolDown is how long a model's requests are held at their worst case
	// once its forecast has been shown wrong (its running requests outlived
	// it, a stream had to be stopped to keep the GPU within budget, or a
	// backend ran out of memory or preempted); its learned lengths start
	// over, so the warm-up follows. Default 30s; negative: none.
	CoolDown Duration `yaml:"cool_down"`
	// AbortHold is how long a request's reservation stays held after the
	// gateway ended its exchange with the backend early (the client hung
	// up, a timeout, a stop): the backend holds its blocks until it notices
	// the abort, and admitting into them would overflow it. Default 1s; 0:
	// released at once.
	AbortHold Duration `yaml:"abort_hold"`
	// Backfill lets requests that fit start past a head request that does
	// not, while that does not delay the head.
	Backfill BackfillConfig `yaml:"backfill"`
	// Ceiling is the fraction of GPU memory that weights plus KV cache may
	// reach, in (0,1]. Default 0.75.
	Ceiling float64 `yaml:"ceiling"`
	// Reserve is activation and runtime memory kept aside per GPU. Default 1GiB.
	Reserve Size `yaml:"reserve"`
	// Pressure is the utilization of a budget above which sheddable classes
	// are refused (429 overloaded), in (0,1]. Default 0.9.
	Pressure float64 `yaml:"pressure"`
	// Queue holds the defaults of every class.
	Queue QueueConfig `yaml:"queue"`
	// Classes are priority classes, highest first. Default: critical,
	// standard, sheddable (sheddable is shed under pressure).
	Classes []ClassConfig `yaml:"classes"`
	// DefaultClass is the class of requests that name none. Default standard.
	DefaultClass string `yaml:"default_class"`
	// PriorityHeader lets a request choose a class at or below its tenant's.
	// Default X-Priority.
	PriorityHeader string `yaml:"priority_header"`
	// DefaultTenantShare caps each tenant without its own share (and
	// anonymous requests), as a fraction of a budget, in (0,1]. Default 1.
	DefaultTenantShare float64 `yaml:"default_tenant_share"`
	// DrainWindow is how far back the release rate behind Retry-After is
	// measured. Default 10s.
	DrainWindow Duration `yaml:"drain_window"`
	// MaxRetryAfter caps Retry-After. Default 60s; at most 120s, the longest
	// Retry-After the official OpenAI clients wait for (openai-python waits
	// up to 60s and backs off on its own past that).
	MaxRetryAfter Duration `yaml:"max_retry_after"`
	// Feedback shrinks a budget while its backend reports more KV in use
	// than the gateway predicted, and grows it back slowly.
	Feedback FeedbackConfig `yaml:"feedback"`
}

// BackfillConfig is the waiting order's one exception to first come, first
// served.
type BackfillConfig struct {
	// Enabled turns backfilling on. Default true.
	Enabled *bool `yaml:"enabled"`
	// MaxHeadAge: a head request that has waited this long is passed by
	// nobody any more. Default 10s.
	MaxHeadAge Duration `yaml:"max_head_age"`
}

// QueueConfig bounds waiting requests.
type QueueConfig struct {
	// MaxRequests per class. Default 1024; negative: never queue.
	MaxRequests int `yaml:"max_requests"`
	// MaxBytes of worst-case KV per class. Default 16 × the budgets of the
	// model's GPUs (a burst of ten times what fits waits rather than being
	// refused).
	MaxBytes Size `yaml:"max_bytes"`
	// Timeout is the longest wait in the queue. Default 30s.
	Timeout Duration `yaml:"timeout"`
}

// ClassConfig is one priority class; absent limits take admission.queue's.
type ClassConfig struct {
	Name        string   `yaml:"name"`
	MaxRequests int      `yaml:"max_requests"`
	MaxBytes    Size     `yaml:"max_bytes"`
	Timeout     Duration `yaml:"timeout"`
	// Sheddable classes are refused while the budget is above pressure.
	// Default: true for a class named sheddable, false otherwise.
	Sheddable *bool `yaml:"sheddable"`
}

// FeedbackConfig is the closed loop on backend-reported KV usage.
type FeedbackConfig struct {
	// Enabled turns the loop on. Default true.
	Enabled *bool `yaml:"enabled"`
	// Decrease multiplies the budget on each report over the ceiling. Default 0.9.
	Decrease float64 `yaml:"decrease"`
	// Increase adds this fraction of the budget on each report under it. Default 0.01.
	Increase float64 `yaml:"increase"`
	// MinFraction is the floor of the shrunk budget. Default 0.25.
	MinFraction float64 `yaml:"min_fraction"`
}

// TenantConfig is one tenant.
type TenantConfig struct {
	Name string `yaml:"name"`
	// APIKeys authenticate the tenant (Authorization: Bearer KEY).
	APIKeys []string `yaml:"api_keys"`
	// Class is the tenant's priority class, the highest its requests may ask
	// for. Default: admission.default_class.
	Class string `yaml:"class"`
	// Share caps what the tenant may hold of each budget, in (0,1].
	// Default admission.default_tenant_share.
	Share float64 `yaml:"share"`
	// QueueShare caps its part of each class queue, in (0,1]. Default Share.
	QueueShare float64 `yaml:"queue_share"`
}

// ModelConfig is one served model.
type ModelConfig struct {
	Name string `yaml:"name"`
	// ServedName, when set, is the name clients send instead of Name (as
	// LiteLLM's model_name → model): the gateway forwards Name, the
	// backend's own, and gives ServedName back in every answer and in
	// /v1/models. Name itself is then not served. Default: Name.
	ServedName string `yaml:"served_name"`
	// Base makes this model a LoRA adapter of the model named Base (vLLM's
	// --lora-modules): it takes its base's geometry and every setting of
	// its KV cache, and counts only its own weights (WeightsBytes, default
	// none) on the GPUs that serve it, beside its base's. Requests for the
	// adapter and its base share the GPU's budget, as on the backend.
	Base string `yaml:"base"`
	// adapterOf is Base once validate has filled the adapter in from it.
	adapterOf string
	// Config is a Hugging Face config.json (or a directory holding one),
	// relative to this file. Either Config or Geometry is required.
	Config   string          `yaml:"config"`
	Geometry *GeometryConfig `yaml:"geometry"`
	// WeightsBytes overrides the weight bytes estimated from the config.
	WeightsBytes Size `yaml:"weights_bytes"`
	// TP is the tensor-parallel size of each backend serving it. Default 1.
	TP int `yaml:"tp"`
	// KVDType is the backend's --kv-cache-dtype. Default auto (the model's).
	KVDType string `yaml:"kv_dtype"`
	// BlockSize is the backend's KV block size in tokens. Default 16.
	BlockSize int `yaml:"block_size"`
	// MaxModelLen caps prompt + output tokens (400 beyond). Default: the
	// config's max_position_embeddings, else 8192.
	MaxModelLen int `yaml:"max_model_len"`
	// DefaultMaxTokens is the output a request without max_tokens is
	// reserved for. Default: max_model_len − prompt.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// Tokenizer is how prompt tokens are counted: backend (the backend's
	// /tokenize, exact) or estimate (bytes × a calibrated ratio). Default
	// backend.
	Tokenizer string `yaml:"tokenizer"`
	// TokenizeCache is how many /tokenize answers (tokenizer: backend) are
	// remembered, so that a prompt seen before is counted without a round
	// trip. Each entry takes about 64 bytes, whatever the prompt's length.
	// Default 16384; negative: no cache.
	TokenizeCache int            `yaml:"tokenize_cache"`
	Estimate      EstimateConfig `yaml:"estimate"`
}

// GeometryConfig gives a model's KV geometry inline instead of a config.json.
type GeometryConfig struct {
	Layers  int    `yaml:"layers"`
	KVHeads int    `yaml:"kv_heads"`
	HeadDim int    `yaml:"head_dim"`
	DType   string `yaml:"dtype"` // default bfloat16
	// MLA: one latent of HeadDim per layer and token, no K/V pair.
	MLA bool `yaml:"mla"`
}

// EstimateConfig tunes the estimate tokenizer.
type EstimateConfig struct {
	// BytesPerToken is the starting ratio, before any calibration. Default 4.
	BytesPerToken float64 `yaml:"bytes_per_token"`
	// Margin is added on top of the estimate as a fraction. Default 0.1.
	Margin float64 `yaml:"margin"`
	// PerMessageTokens is the chat template's overhead per message. Default 4.
	PerMessageTokens int `yaml:"per_message_tokens"`
	// ImageTokens is charged for each non-text content part. Default 1024.
	ImageTokens int `yaml:"image_tokens"`
}

// BackendConfig is one upstream server.
type BackendConfig struct {
	Name   string   `yaml:"name"`
	URL    string   `yaml:"url"`
	Models []string `yaml:"models"`
	// GPU names the GPU (group) the backend runs on; backends with the same
	// GPU share one budget. Default: the backend's name.
	GPU string `yaml:"gpu"`
	// GPUMemory is the memory of one GPU of the backend: a size (24GiB), or
	// nvml / nvml:N to read local GPU N through NVML at load. Required
	// unless KVBudget is given.
	GPUMemory string `yaml:"gpu_memory"`
	// KVBudget gives the budget in bytes directly, overriding the computation
	// from gpu_memory.
	KVBudget Size `yaml:"kv_budget"`
	// OtherUsed is memory used on the GPU by other processes. Default 0.
	OtherUsed Size `yaml:"other_used"`
	// APIKey is sent to the backend as a bearer token. Default none.
	APIKey string `yaml:"api_key"`
	// TLS tunes an https:// url (tls.go): CA, server name, client
	// certificate. Default: the system's roots and the url's host. Refused
	// with an http:// url.
	TLS    *BackendTLSConfig `yaml:"tls"`
	Health HealthConfig      `yaml:"health"`
	Scrape ScrapeConfig      `yaml:"metrics"`
	// MaxConnections to the backend. Default 1024.
	MaxConnections int `yaml:"max_connections"`
	// FirstByteTimeout bounds the wait for a streamed request's first event
	// (vLLM sends it once prefill is done): past it the request gets 504
	// upstream_timeout, its reservation is released, and the timeout counts
	// towards the backend's circuit. Non-streamed answers arrive whole and
	// are bounded by server.request_timeout alone. Default 60s.
	FirstByteTimeout Duration `yaml:"first_byte_timeout"`
	// TokenizeTimeout bounds one /tokenize call; past it (or on any failure)
	// the prompt is estimated instead. Default 2s.
	TokenizeTimeout Duration `yaml:"tokenize_timeout"`
	// MaxConcurrency is its limit in admission mode count. Default
	// admission.max_concurrency.
	MaxConcurrency int `yaml:"max_concurrency"`
}

// abortHold is the resolved admission.abort_hold.
func (a AdmissionConfig) abortHold() time.Duration {
	if a.AbortHold.raw == "" && a.AbortHold.D == 0 {
		return defaultAbortHold
	}
	return a.AbortHold.D
}

// defaultAbortHold: the simulator notices an abort at its next step and
// vLLM at its next token, tens of milliseconds; a second covers a backend
// under load with room to spare.
const defaultAbortHold = time.Second

// epsilon is the resolved admission.epsilon.
func (a AdmissionConfig) epsilon() float64 {
	if a.Epsilon == 0 {
		return admission.DefaultEpsilon
	}
	return a.Epsilon
}

func (b BackendConfig) maxConcurrency(a AdmissionConfig) int {
	if b.MaxConcurrency > 0 {
		return b.MaxConcurrency
	}
	return a.MaxConcurrency
}

// HealthConfig is a backend's active health check and circuit.
type HealthConfig struct {
	Path     string   `yaml:"path"`     // default /health
	Interval Duration `yaml:"interval"` // default 1s
	Timeout  Duration `yaml:"timeout"`  // default 2s
	Failures int      `yaml:"failures"` // consecutive failures that open the circuit; default 3
	Cooldown Duration `yaml:"cooldown"` // before a circuit that timeouts opened lets requests try again; default 5s
}

// AdminConfig guards /status and /metrics.
type AdminConfig struct {
	// APIKeys, when any is set, are required (Authorization: Bearer KEY) on
	// /status and /metrics; a tenant's key does not open them. Default
	// none: both are open. /healthz and /readyz always are (probes).
	APIKeys []string `yaml:"api_keys"`
}

// ScrapeConfig is a backend's /metrics scrape.
type ScrapeConfig struct {
	Path     string   `yaml:"path"`     // default /metrics; "-" disables
	Interval Duration `yaml:"interval"` // default 1s
}

// LogConfig sets the log output.
type LogConfig struct {
	Level  string `yaml:"level"`  // debug, info (default), warn, error
	Format string `yaml:"format"` // text (default) or json
	// Access writes one line per proxied request (accesslog.go), at info.
	// Default true: LLM requests are few and long, so a line each costs
	// little beside them, and it is the one record of why a request was
	// refused. A reload may change it.
	Access *bool `yaml:"access"`
}

// access is the resolved log.access.
func (l LogConfig) access() bool { return l.Access == nil || *l.Access }

// Duration is a YAML duration ("30s"). A bad value is reported by Load with
// the field's path.
type Duration struct {
	D   time.Duration
	raw string
	err error
}

// UnmarshalYAML keeps the text and any parse error for validation.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	d.raw = n.Value
	d.D, d.err = time.ParseDuration(strings.TrimSpace(n.Value))
	if d.err == nil && d.D < 0 {
		d.err = errors.New("must not be negative")
	}
	if d.err != nil {
		d.err = fmt.Errorf("invalid duration %q (want e.g. 30s, 500ms, 2m): %w", n.Value, d.err)
	}
	return nil
}

func (d Duration) or(def time.Duration) time.Duration {
	if d.D == 0 {
		return def
	}
	return d.D
}

// Size is a YAML memory size ("24GiB", "80GB", or bytes).
type Size struct {
	Bytes int64
	err   error
}

// UnmarshalYAML keeps any parse error for validation.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	sz, err := kvbudget.ParseSize(n.Value)
	s.Bytes, s.err = sz.Bytes, err
	return nil
}

// LoadFile reads and validates a config file.
func LoadFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(data, filepath.Dir(abs))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse reads and validates a config; dir resolves relative paths.
func Parse(data []byte, dir string) (*Config, error) {
	c := &Config{dir: dir}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlSyntaxError(data, err)
	}
	if err := checkShape(&doc); err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true) // checkShape found every unknown key; this is a safety net
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlSyntaxError(data, err)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Path resolves p against the config file's directory.
func (c *Config) Path(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(c.dir, p)
}

// Defaults of fields whose zero value means "default".
const (
	defaultListen          = "127.0.0.1:8080"
	defaultMaxBody         = 8 << 20
	defaultMaxHeader       = 16 << 10
	defaultMaxSSELine      = 4 << 20
	defaultFirstByte       = 60 * time.Second
	defaultTokenize        = 2 * time.Second
	defaultReadTimeout     = 30 * time.Second
	defaultIdleTimeout     = 2 * time.Minute
	defaultMaxConns        = 10000
	defaultRequestTimeout  = 10 * time.Minute
	defaultShutdownTimeout = 30 * time.Second
	defaultPriorityHeader  = "X-Priority"
	defaultMaxModelLen     = 8192
	// maxClientRetryAfter is openai-go's cap on a Retry-After it honours.
	maxClientRetryAfter   = 2 * time.Minute
	defaultMaxConcurrency = 16
	defaultSessionHeader  = "X-Session-Id"
	defaultTokenizeCache  = 16384
	maxTokenizeCache      = 1 << 24
)

// validate fills defaults and checks every field, reporting all problems.
func (c *Config) validate() error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
	}
	dur := func(field string, d Duration) {
		if d.err != nil {
			bad(field, "%v", d.err)
		}
	}
	size := func(field string, s Size) {
		if s.err != nil {
			bad(field, "%v", s.err)
		}
	}
	// name checks that an entry of a list has a name no other entry has.
	name := func(seen map[string]bool, field, what, n string) {
		if n == "" {
			bad(field, "required")
		} else if seen[n] {
			bad(field, "duplicate %s %q", what, n)
		}
		seen[n] = true
	}

	if c.Listen == "" {
		c.Listen = defaultListen
	}
	if c.Server.CORS != nil {
		c.Server.CORS.validate("server.cors", bad)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "%q is not host:port", c.Listen)
	}
	s := &c.Server
	size("server.max_body_bytes", s.MaxBodyBytes)
	if s.MaxBodyBytes.Bytes == 0 {
		s.MaxBodyBytes.Bytes = defaultMaxBody
	}
	size("server.max_header_bytes", s.MaxHeaderBytes)
	if s.MaxHeaderBytes.Bytes == 0 {
		s.MaxHeaderBytes.Bytes = defaultMaxHeader
	}
	if s.MaxHeaderBytes.Bytes < 1<<10 || s.MaxHeaderBytes.Bytes > 1<<30 {
		bad("server.max_header_bytes", "%s is not in [1KiB, 1GiB]", kvbudget.FormatBytes(s.MaxHeaderBytes.Bytes))
	}
	size("server.max_sse_line_bytes", s.MaxSSELineBytes)
	if s.MaxSSELineBytes.Bytes == 0 {
		s.MaxSSELineBytes.Bytes = defaultMaxSSELine
	}
	if s.MaxSSELineBytes.Bytes < 64<<10 || s.MaxSSELineBytes.Bytes > 1<<30 {
		bad("server.max_sse_line_bytes", "%s is not in [64KiB, 1GiB]", kvbudget.FormatBytes(s.MaxSSELineBytes.Bytes))
	}
	dur("server.read_timeout", s.ReadTimeout)
	dur("server.write_timeout", s.WriteTimeout)
	dur("server.idle_timeout", s.IdleTimeout)
	dur("server.request_timeout", s.RequestTimeout)
	dur("server.shutdown_timeout", s.ShutdownTimeout)
	dur("server.drain_delay", s.DrainDelay)
	if s.MaxConnections < 0 {
		bad("server.max_connections", "must be >= 0 (0 = %d)", defaultMaxConns)
	}
	if s.WriteTimeout.D != 0 && s.WriteTimeout.D < s.requestTimeout() {
		bad("server.write_timeout", "%s is shorter than server.request_timeout (%s): streams would be cut before they may end", s.WriteTimeout.D, s.requestTimeout())
	}

	a := &c.Admission
	if a.Ceiling == 0 {
		a.Ceiling = kvbudget.DefaultCeiling
	}
	if a.Ceiling < 0 || a.Ceiling > 1 {
		bad("admission.ceiling", "%v is not in (0, 1]", a.Ceiling)
	}
	size("admission.reserve", a.Reserve)
	if a.Reserve.Bytes == 0 {
		a.Reserve.Bytes = kvbudget.DefaultReserve
	}
	if a.Pressure < 0 || a.Pressure > 1 {
		bad("admission.pressure", "%v is not in (0, 1]", a.Pressure)
	}
	if a.DefaultTenantShare < 0 || a.DefaultTenantShare > 1 {
		bad("admission.default_tenant_share", "%v is not in (0, 1]", a.DefaultTenantShare)
	}
	size("admission.queue.max_bytes", a.Queue.MaxBytes)
	dur("admission.queue.timeout", a.Queue.Timeout)
	dur("admission.drain_window", a.DrainWindow)
	dur("admission.max_retry_after", a.MaxRetryAfter)
	if a.MaxRetryAfter.D != 0 && a.MaxRetryAfter.D < time.Second {
		bad("admission.max_retry_after", "must be at least 1s")
	}
	if a.MaxRetryAfter.D > maxClientRetryAfter {
		bad("admission.max_retry_after", "%s is above %s: the official OpenAI clients do not wait past their own cap (openai-go gives up on a longer Retry-After), so every 429 beyond it becomes a failure",
			a.MaxRetryAfter.D, maxClientRetryAfter)
	}
	if a.PriorityHeader == "" {
		a.PriorityHeader = defaultPriorityHeader
	}
	if len(a.Classes) == 0 {
		a.Classes = []ClassConfig{{Name: "critical"}, {Name: "standard"}, {Name: "sheddable"}}
	}
	classes := map[string]bool{}
	for i := range a.Classes {
		cl := &a.Classes[i]
		f := fmt.Sprintf("admission.classes[%d]", i)
		name(classes, f+".name", "class", cl.Name)
		size(f+".max_bytes", cl.MaxBytes)
		dur(f+".timeout", cl.Timeout)
		if cl.Sheddable == nil {
			shed := cl.Name == "sheddable"
			cl.Sheddable = &shed
		}
	}
	if a.DefaultClass == "" {
		a.DefaultClass = "standard"
		if !classes["standard"] {
			a.DefaultClass = a.Classes[len(a.Classes)/2].Name
		}
	}
	if !classes[a.DefaultClass] {
		bad("admission.default_class", "%q is not one of admission.classes", a.DefaultClass)
	}
	switch a.Mode {
	case "":
		a.Mode = modeKV
	case modeKV, modeCount:
	default:
		bad("admission.mode", "%q is not %s or %s", a.Mode, modeKV, modeCount)
	}
	if a.MaxConcurrency == 0 {
		a.MaxConcurrency = defaultMaxConcurrency
	}
	if a.MaxConcurrency < 0 {
		bad("admission.max_concurrency", "must be >= 1")
	}
	switch a.Reservation {
	case "":
		a.Reservation = admission.WorstCase
	case admission.Predicted, admission.WorstCase:
	default:
		bad("admission.reservation", "%q is not %s or %s", a.Reservation, admission.Predicted, admission.WorstCase)
	}
	if a.Epsilon < 0 || a.Epsilon >= 0.5 || math.IsNaN(a.Epsilon) {
		bad("admission.epsilon", "%v is not in (0, 0.5)", a.Epsilon)
	}
	if h := a.Headroom; h != nil && (*h < 0 || *h >= 0.5 || math.IsNaN(*h)) {
		bad("admission.headroom", "%v is not in [0, 0.5)", *h)
	}
	if o := a.MaxOvercommit; o != 0 && (o < 1 || math.IsNaN(o)) {
		bad("admission.max_overcommit", "%v must be >= 1 (a multiple of the budget)", o)
	}
	if a.AbortHold.D < 0 {
		bad("admission.abort_hold", "%v must be >= 0", a.AbortHold.D)
	}
	if a.Backfill.Enabled == nil {
		on := true
		a.Backfill.Enabled = &on
	}
	dur("admission.backfill.max_head_age", a.Backfill.MaxHeadAge)
	fb := &a.Feedback
	if fb.Enabled == nil {
		on := true
		fb.Enabled = &on
	}
	if fb.Decrease < 0 || fb.Decrease >= 1 {
		bad("admission.feedback.decrease", "%v is not in (0, 1)", fb.Decrease)
	}
	if fb.Increase < 0 || fb.Increase > 1 {
		bad("admission.feedback.increase", "%v is not in (0, 1]", fb.Increase)
	}
	if fb.MinFraction < 0 || fb.MinFraction > 1 {
		bad("admission.feedback.min_fraction", "%v is not in (0, 1]", fb.MinFraction)
	}

	keys := map[string]string{}
	tenants := map[string]bool{}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		f := fmt.Sprintf("tenants[%d]", i)
		name(tenants, f+".name", "tenant", t.Name)
		for j, k := range t.APIKeys {
			if k == "" {
				bad(fmt.Sprintf("%s.api_keys[%d]", f, j), "empty key")
			} else if other, dup := keys[k]; dup {
				bad(fmt.Sprintf("%s.api_keys[%d]", f, j), "key already belongs to tenant %q", other)
			}
			keys[k] = t.Name
		}
		if t.Class == "" {
			t.Class = a.DefaultClass
		} else if !classes[t.Class] {
			bad(f+".class", "%q is not one of admission.classes", t.Class)
		}
		if t.Share < 0 || t.Share > 1 {
			bad(f+".share", "%v is not in (0, 1]", t.Share)
		}
		if t.QueueShare < 0 || t.QueueShare > 1 {
			bad(f+".queue_share", "%v is not in (0, 1]", t.QueueShare)
		}
	}

	for i, k := range c.Admin.APIKeys {
		f := fmt.Sprintf("admin.api_keys[%d]", i)
		if k == "" {
			bad(f, "empty key")
		} else if t, dup := keys[k]; dup {
			bad(f, "also a key of tenant %q: give operators keys of their own", t)
		}
	}

	if len(c.Models) == 0 {
		bad("models", "at least one model is required")
	}
	models := map[string]bool{}
	served := map[string]bool{} // the names clients send
	for i := range c.Models {
		m := &c.Models[i]
		f := fmt.Sprintf("models[%d]", i)
		name(models, f+".name", "model", m.Name)
		client, field := m.Name, f+".name"
		if m.ServedName != "" {
			client, field = m.ServedName, f+".served_name"
		}
		if served[client] {
			bad(field, "%q is already a name clients send for another model", client)
		}
		served[client] = true
		if m.Base != "" {
			continue // checked, and filled in from its base, below
		}
		switch {
		case m.Config == "" && m.Geometry == nil:
			bad(f, "one of config (a config.json path) or geometry is required")
		case m.Config != "" && m.Geometry != nil:
			bad(f, "config and geometry are exclusive")
		}
		if g := m.Geometry; g != nil {
			if g.Layers <= 0 {
				bad(f+".geometry.layers", "must be > 0")
			}
			if g.KVHeads <= 0 && !g.MLA {
				bad(f+".geometry.kv_heads", "must be > 0")
			}
			if g.HeadDim <= 0 {
				bad(f+".geometry.head_dim", "must be > 0")
			}
			if g.DType != "" {
				if _, err := kvbudget.ParseDType(g.DType); err != nil {
					bad(f+".geometry.dtype", "%v", err)
				}
			}
		}
		size(f+".weights_bytes", m.WeightsBytes)
		if m.TP == 0 {
			m.TP = 1
		}
		if m.TP < 0 {
			bad(f+".tp", "must be >= 1")
		}
		if m.BlockSize == 0 {
			m.BlockSize = kvbudget.DefaultBlockSize
		}
		if m.BlockSize < 0 {
			bad(f+".block_size", "must be >= 1")
		}
		if m.MaxModelLen < 0 {
			bad(f+".max_model_len", "must be > 0")
		}
		if m.DefaultMaxTokens < 0 {
			bad(f+".default_max_tokens", "must be >= 0")
		}
		switch m.Tokenizer {
		case "":
			m.Tokenizer = "backend"
		case "backend", "estimate":
		default:
			bad(f+".tokenizer", "%q is not backend or estimate", m.Tokenizer)
		}
		if m.TokenizeCache == 0 {
			m.TokenizeCache = defaultTokenizeCache
		}
		if m.TokenizeCache > maxTokenizeCache {
			bad(f+".tokenize_cache", "%d entries is more than %d", m.TokenizeCache, maxTokenizeCache)
		}
		e := &m.Estimate
		if e.BytesPerToken == 0 {
			e.BytesPerToken = 4
		}
		if e.BytesPerToken < 0 {
			bad(f+".estimate.bytes_per_token", "must be > 0")
		}
		if e.Margin == 0 {
			e.Margin = 0.1
		}
		if e.Margin < 0 || e.Margin > 10 {
			bad(f+".estimate.margin", "%v is not in [0, 10]", e.Margin)
		}
		if e.PerMessageTokens == 0 {
			e.PerMessageTokens = 4
		}
		if e.ImageTokens == 0 {
			e.ImageTokens = 1024
		}
		if e.PerMessageTokens < 0 || e.ImageTokens < 0 {
			bad(f+".estimate", "per_message_tokens and image_tokens must be >= 0")
		}
	}

	c.fillAdapters(bad)

	if len(c.Backends) == 0 {
		bad("backends", "at least one backend is required")
	}
	names := map[string]bool{}
	for i := range c.Backends {
		b := &c.Backends[i]
		f := fmt.Sprintf("backends[%d]", i)
		name(names, f+".name", "backend", b.Name)
		if b.URL == "" {
			bad(f+".url", "required")
		}
		if len(b.Models) == 0 {
			bad(f+".models", "at least one model is required")
		}
		for j, m := range b.Models {
			if !models[m] {
				bad(fmt.Sprintf("%s.models[%d]", f, j), "%q is not one of models", m)
			}
		}
		if b.GPU == "" {
			b.GPU = b.Name
		}
		size(f+".kv_budget", b.KVBudget)
		size(f+".other_used", b.OtherUsed)
		if b.GPUMemory == "" && b.KVBudget.Bytes == 0 {
			bad(f+".gpu_memory", "required (a size such as 24GiB, or nvml[:index]) unless kv_budget is given")
		} else if b.GPUMemory != "" && !strings.HasPrefix(b.GPUMemory, "nvml") {
			if _, err := kvbudget.ParseMemory(b.GPUMemory); err != nil {
				bad(f+".gpu_memory", "%v", err)
			}
		}
		for _, pth := range []struct{ field, v string }{{f + ".health.path", b.Health.Path}, {f + ".metrics.path", b.Scrape.Path}} {
			if pth.v != "" && pth.v != "-" && !strings.HasPrefix(pth.v, "/") {
				bad(pth.field, "%q must start with /", pth.v)
			}
		}
		if b.Health.Path == "-" {
			bad(f+".health.path", "health checks cannot be disabled (only metrics.path takes -)")
		}
		dur(f+".health.interval", b.Health.Interval)
		dur(f+".health.timeout", b.Health.Timeout)
		dur(f+".health.cooldown", b.Health.Cooldown)
		dur(f+".metrics.interval", b.Scrape.Interval)
		if b.Health.Failures < 0 {
			bad(f+".health.failures", "must be >= 1")
		}
		if b.MaxConnections < 0 {
			bad(f+".max_connections", "must be >= 0")
		}
		dur(f+".first_byte_timeout", b.FirstByteTimeout)
		dur(f+".tokenize_timeout", b.TokenizeTimeout)
		if b.MaxConcurrency < 0 {
			bad(f+".max_concurrency", "must be >= 1")
		}
	}
	for m := range models {
		served := false
		for _, b := range c.Backends {
			for _, bm := range b.Models {
				served = served || bm == m
			}
		}
		if !served && m != "" {
			bad("models", "model %q is served by no backend", m)
		}
	}
	switch c.Routing {
	case "":
		c.Routing = routingLeastLoaded
	case routingLeastLoaded, routingAffinity:
	default:
		bad("routing", "%q is not %s or %s", c.Routing, routingLeastLoaded, routingAffinity)
	}
	if c.SessionHeader == "" {
		c.SessionHeader = defaultSessionHeader
	}
	switch c.Log.Level {
	case "", "debug", "info", "warn", "error":
	default:
		bad("log.level", "%q is not debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "", "text", "json":
	default:
		bad("log.format", "%q is not text or json", c.Log.Format)
	}
	errs = append(errs, c.SharedBudget.Validate()) // nil without the section
	c.validateServerTLS(bad)
	c.validateBackendTLS(bad)
	return errors.Join(errs...)
}

// sameAs compares the resolved limits of two server sections.
func (s ServerConfig) sameAs(o ServerConfig) bool {
	return s.MaxBodyBytes.Bytes == o.MaxBodyBytes.Bytes && s.MaxHeaderBytes.Bytes == o.MaxHeaderBytes.Bytes &&
		s.MaxSSELineBytes.Bytes == o.MaxSSELineBytes.Bytes && s.ReadTimeout.D == o.ReadTimeout.D && s.WriteTimeout.D == o.WriteTimeout.D &&
		s.IdleTimeout.D == o.IdleTimeout.D && s.MaxConnections == o.MaxConnections && s.RequestTimeout.D == o.RequestTimeout.D &&
		s.ShutdownTimeout.D == o.ShutdownTimeout.D && s.drainDelay() == o.drainDelay()
}

// maxBody, timeouts: the server's resolved limits.
func (s ServerConfig) requestTimeout() time.Duration {
	return s.RequestTimeout.or(defaultRequestTimeout)
}

// DrainTimeout is how long a shutdown waits for in-flight requests:
// shutdown_timeout, or its default.
func (s ServerConfig) DrainTimeout() time.Duration {
	return s.ShutdownTimeout.or(defaultShutdownTimeout)
}

// drainDelay is the resolved server.drain_delay: an explicit 0s is none.
func (s ServerConfig) drainDelay() time.Duration {
	if s.DrainDelay.raw == "" && s.DrainDelay.D == 0 {
		return defaultDrainDelay
	}
	return s.DrainDelay.D
}

// defaultDrainDelay: Kubernetes takes a terminating pod out of its
// Service's endpoints at once, and kube-proxy and ingress controllers
// follow within a few seconds; a load balancer probing /readyz needs its
// interval times its failure threshold, which the operator sets to match.
const defaultDrainDelay = 5 * time.Second

func (s ServerConfig) writeTimeout() time.Duration {
	return s.WriteTimeout.or(s.requestTimeout() + time.Minute)
}

func (s ServerConfig) maxConns() int {
	if s.MaxConnections == 0 {
		return defaultMaxConns
	}
	return s.MaxConnections
}

// fillAdapters checks each LoRA adapter (models[].base) and fills it in
// from its base, checked and defaulted already: an adapter is its base's
// geometry and cache settings under its own names and weights.
func (c *Config) fillAdapters(bad func(field, format string, a ...any)) {
	index := map[string]int{}
	for i, m := range c.Models {
		index[m.Name] = i
	}
	for i := range c.Models {
		m := &c.Models[i]
		if m.Base == "" {
			continue
		}
		f := fmt.Sprintf("models[%d]", i)
		j, ok := index[m.Base]
		switch {
		case !ok:
			bad(f+".base", "%q is not one of the models", m.Base)
			continue
		case c.Models[j].Base != "":
			bad(f+".base", "%q is an adapter itself: an adapter's base must be a model", m.Base)
			continue
		case m.Config != "" || m.Geometry != nil || m.TP != 0 || m.KVDType != "" || m.BlockSize != 0 || m.MaxModelLen != 0:
			bad(f, "an adapter (base: %s) takes its base's config, geometry, tp, kv_dtype, block_size and max_model_len; set them on %s", m.Base, m.Base)
			continue
		}
		if m.WeightsBytes.Bytes < 0 {
			bad(f+".weights_bytes", "must be >= 0")
		}
		own := *m
		*m = c.Models[j]
		m.Name, m.ServedName, m.Base, m.adapterOf, m.WeightsBytes = own.Name, own.ServedName, own.Base, own.Base, own.WeightsBytes
		if own.DefaultMaxTokens != 0 {
			m.DefaultMaxTokens = own.DefaultMaxTokens
		}
	}
}
