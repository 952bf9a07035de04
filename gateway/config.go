package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/admission/sharedbudget"
	"github.com/kvgate/kvgate/internal/confval"
)

// Config is the gateway's one YAML file. Every field documents its default
// (what an absent or zero value means); Load fills the defaults and rejects
// bad values with the field's path in the message. The README's
// configuration reference is the operators' version of this.
//
// Every key's default is one row of configDefaults (configdefaults.go),
// which the sections' defaults methods fill from and the README's
// configuration reference shows. Each section lives in a file of its own
// with its validate: config_server.go (listen, server),
// config_admission.go (admission, tenants), config_models.go,
// config_backends.go; the top level, log and admin are here, shared_budget
// in package sharedbudget (its defaults there).
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
	// through Redis (package sharedbudget). Default: none, the budget is this
	// process's alone.
	SharedBudget *sharedbudget.Config `yaml:"shared_budget"`
	// Passthrough lists the routes forwarded to a backend as they are
	// (passthrough.go): paths, or prefixes ending in /*. Default: vLLM's
	// /detokenize, /tokenizer_info, /version and /v1/audio/*; [] for none.
	Passthrough []string `yaml:"passthrough"`
	// Tracing exports a span per proxied request over OTLP/HTTP
	// (config_tracing.go). Default: off.
	Tracing TracingConfig `yaml:"tracing"`
	// GPUWatch watches each GPU's memory and the processes holding it
	// (config_gpuwatch.go). Default: NVML where this host has it.
	GPUWatch GPUWatchConfig `yaml:"gpu_watch"`

	// dir is the directory of the file, against which relative paths resolve.
	dir string
}

// Routing policies (Config.Routing).
const (
	routingLeastLoaded = "least_loaded"
	routingAffinity    = "affinity"
)

// LogConfig sets the log output.
type LogConfig struct {
	Level  string `yaml:"level"`  // debug, info (default), warn, error
	Format string `yaml:"format"` // text (default) or json
	// Access writes one line per proxied request (records.go), at info.
	// Default true: LLM requests are few and long, so a line each costs
	// little beside them, and it is the one record of why a request was
	// refused. A reload may change it.
	Access *bool `yaml:"access"`
}

// AdminConfig guards /status and /metrics.
type AdminConfig struct {
	// APIKeys, when any is set, are required (Authorization: Bearer KEY) on
	// /status and /metrics; a tenant's key does not open them. Default
	// none: both are open. /healthz and /readyz always are (probes).
	APIKeys []string `yaml:"api_keys"`
}

// Duration is a YAML duration ("30s"); a bad value is reported by Load with
// the field's path.
type Duration = confval.Duration

// Size is a YAML memory size ("24GiB", "80GB", or bytes); a bad value is
// reported by Load with the field's path.
type Size = confval.Size

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
	lines := indexLines(&doc)
	shape := checkShape(&doc)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true) // checkShape found every unknown key; this is a safety net
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		// What the shape refused did not decode; the rest did, and its
		// values are checked in the same pass (configlines.go).
		var te *yaml.TypeError
		if shape == nil || !errors.As(err, &te) {
			return nil, yamlSyntaxError(data, err)
		}
	}
	if err := lines.onePass(shape, c.validate()); err != nil {
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

// problems collects what is wrong with a config, each under its field's
// path, in the order the sections are checked.
type problems struct{ errs []error }

func (p *problems) bad(field, format string, a ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
}

// dur and size report a value the file gave that did not parse.
func (p *problems) dur(field string, d Duration) {
	if err := d.Err(); err != nil {
		p.bad(field, "%v", err)
	}
}

func (p *problems) size(field string, s Size) {
	if err := s.Err(); err != nil {
		p.bad(field, "%v", err)
	}
}

// name checks that an entry of a list has a name no other entry has.
func (p *problems) name(seen map[string]bool, field, what, n string) {
	if n == "" {
		p.bad(field, "required")
	} else if seen[n] {
		p.bad(field, "duplicate %s %q", what, n)
	}
	seen[n] = true
}

// validate fills the defaults of every section and checks it, reporting
// every problem of the file at once. Each section's validate fills its
// defaults first (one function per section: its defaults method), then
// checks; the sections run in the order of the messages an operator sees.
func (c *Config) validate() error {
	var p problems
	fillDefaults("", c) // listen, routing, session_header
	c.validateServer(&p)
	classes := c.Admission.validate(&p)
	keys := c.validateTenants(&p, classes)
	c.Admin.validate(&p, keys)
	models := c.validateModels(&p)
	c.validateBackends(&p, models)
	c.validateRouting(&p)
	c.validatePassthrough(&p)
	c.Log.validate(&p)
	c.validateTracing(&p)
	c.validateGPUWatch(&p)
	if c.SharedBudget != nil {
		p.errs = append(p.errs, c.SharedBudget.Validate())
		if c.Admission.LengthsFile.Path != "" {
			p.bad("admission.lengths_file.path", "a replica with shared_budget starts from the fleet's learned lengths in Redis; the file is for a gateway alone")
		}
	}
	c.validateServerTLS(p.bad)
	c.validateBackendTLS(p.bad)
	return errors.Join(p.errs...)
}

// validateRouting checks routing.
func (c *Config) validateRouting(p *problems) {
	switch c.Routing {
	case routingLeastLoaded, routingAffinity:
	default:
		p.bad("routing", "%q is not %s or %s", c.Routing, routingLeastLoaded, routingAffinity)
	}
}

func (l *LogConfig) defaults() { fillDefaults("log", l) }

// validate fills and checks the log section.
func (l *LogConfig) validate(p *problems) {
	l.defaults()
	switch l.Level {
	case "debug", "info", "warn", "error":
	default:
		p.bad("log.level", "%q is not debug, info, warn or error", l.Level)
	}
	switch l.Format {
	case "text", "json":
	default:
		p.bad("log.format", "%q is not text or json", l.Format)
	}
}

// validate checks the admin keys; keys are the tenants' (key → tenant), of
// which none may open the operators' views.
func (a *AdminConfig) validate(p *problems, keys map[string]string) {
	for i, k := range a.APIKeys {
		f := fmt.Sprintf("admin.api_keys[%d]", i)
		if k == "" {
			p.bad(f, "empty key")
		} else if t, dup := keys[k]; dup {
			p.bad(f, "also a key of tenant %q: give operators keys of their own", t)
		}
	}
}
