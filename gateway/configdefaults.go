package gateway

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/kvbudget"
)

// A configDefault is what one key of the config file means when the file
// leaves it out. configDefaults lists every key once, in the README's
// order: the sections' defaults methods fill from it (fillDefaults), and
// the README's configuration reference shows each row's default
// (TestREADMEShowsEveryDefault), so that the two cannot differ.
type configDefault struct {
	// path is the key in the file: section.key, [] for each entry of a
	// list (models[].tp).
	path string
	// value is what an absent key is set to, of the key's kind: string,
	// int, float64, bool, time.Duration, byteSize, or []string. nil where the
	// absent key means no value (none, off, required) or one derived from
	// other keys, which shown says.
	value any
	// shown is the default as the README says it, where value alone does
	// not: a text, or a format whose %s is value written as the file would
	// write it.
	shown string
	// by is who applies value, where fillDefaults does not: admission (the
	// scheduler resolves the zero the gateway passes it), backends
	// (backends.Spec.WithDefaults), or the gateway file that does.
	by string
	// keepZero: a zero the file writes (0s) is a value, not the default's
	// place; only an absent key takes the default.
	keepZero bool
	// whole: the row is the README's for the key and every key under it
	// (a list of classes, a geometry), whose defaults its meaning gives.
	whole bool
	doc   string
}

// byteSize is a size's default, in bytes.
type byteSize int64

// Defaults that other code than fillDefaults reads (model.go, estimate.go).
const (
	defaultGPUInterval   = 5 * time.Second
	defaultTokenizeCache = 16384
	defaultImageTokens   = 16384
	defaultMaxModelLen   = 8192
	// defaultWriteSlack is what write_timeout adds to request_timeout by
	// default: the answer's last bytes after the request's deadline.
	defaultWriteSlack = time.Minute
)

// The headers a request may choose its class and session by, which a
// browser's preflight may ask for by default.
const (
	defaultPriorityHeader = "X-Priority"
	defaultSessionHeader  = "X-Session-Id"
)

// The defaults of server.cors, which config_server.go fills when the section is
// given.
var (
	defaultCORSMethods = []string{"GET", "POST", "OPTIONS"}
	defaultCORSHeaders = []string{"Authorization", "Content-Type", "X-Request-Id", "OpenAI-Organization", "OpenAI-Project",
		"X-Stainless-*", defaultPriorityHeader, defaultSessionHeader}
)

// By whom a default is applied, where fillDefaults does not.
const (
	byAdmission = "admission"
	byBackends  = "backends"
	byDerived   = "derived" // from other keys, by the section's defaults method
	byModel     = "model.go"
)

var configDefaults = []configDefault{
	// The top level.
	{path: "listen", value: "127.0.0.1:8080", doc: "address to serve on"},
	{path: "server", doc: "HTTP limits"},
	{path: "admission", doc: "KV budget policy"},
	{path: "tenants", shown: "none", doc: "API keys to tenants; none: anonymous"},
	{path: "models", shown: "**required**", doc: "served models"},
	{path: "backends", shown: "**required**", doc: "upstream servers"},
	{path: "log.level", value: "info", doc: "debug, info, warn or error"},
	{path: "log.format", value: "text", doc: "text or json"},
	// On: LLM requests are few and long, so a line each costs little
	// beside them, and it is the one record of why a request was refused.
	{path: "log.access", value: true, doc: "one line per proxied request"},
	{path: "routing", value: routingLeastLoaded, doc: "least_loaded or affinity"},
	{path: "session_header", value: defaultSessionHeader, doc: "a client's session key for affinity"},
	{path: "admin.api_keys", shown: "none", doc: "keys that open /status and /metrics"},
	{path: "shared_budget", shown: "none", whole: true, doc: "share each GPU's budget with other replicas (sharedbudget.Config)"},
	{path: "tracing", shown: "off", doc: "a span per proxied request over OTLP/HTTP"},
	{path: "gpu_watch", shown: "NVML where this host has it", doc: "each GPU's memory and its processes"},
	{path: "passthrough", value: defaultPassthrough, by: "passthrough.go", doc: "routes forwarded as they are"},

	// server
	{path: "server.max_body_bytes", value: byteSize(8 << 20), doc: "largest request body (413 beyond)"},
	{path: "server.max_header_bytes", value: byteSize(16 << 10), doc: "request line and headers (431 beyond)"},
	{path: "server.max_sse_line_bytes", value: byteSize(4 << 20), doc: "longest line of a backend's stream"},
	{path: "server.read_timeout", value: 30 * time.Second, doc: "reading one request"},
	{path: "server.write_timeout", value: defaultWriteSlack, shown: "`request_timeout` + %s", by: byDerived, doc: "writing one response, a whole stream included"},
	{path: "server.idle_timeout", value: 2 * time.Minute, doc: "idle keep-alive connections are closed"},
	{path: "server.max_connections", value: 10000, doc: "concurrent client connections"},
	{path: "server.request_timeout", value: 10 * time.Minute, doc: "arrival to last byte, queueing included"},
	// Kubernetes takes a terminating pod out of its Service's endpoints at
	// once, and kube-proxy and ingress controllers follow within a few
	// seconds; a load balancer probing /readyz needs its interval times its
	// failure threshold, which the operator sets to match.
	{path: "server.drain_delay", value: 5 * time.Second, keepZero: true, doc: "serving on after SIGTERM while /readyz answers 503"},
	{path: "server.shutdown_timeout", value: 30 * time.Second, doc: "SIGTERM's wait for in-flight requests"},
	{path: "server.cors.allowed_origins", shown: "off", doc: "origins whose pages may call the gateway"},
	{path: "server.cors.allowed_methods", value: defaultCORSMethods, by: "config_server.go", doc: "methods a preflight may ask for"},
	{path: "server.cors.allowed_headers", value: defaultCORSHeaders, by: "config_server.go", doc: "headers a preflight may ask for"},
	{path: "server.tls.cert_file", shown: "none: plain HTTP", doc: "the served certificate (chain)"},
	{path: "server.tls.key_file", shown: "none: plain HTTP", doc: "the served certificate's key"},
	{path: "server.tls.client_ca_file", shown: "none", doc: "CA of clients' certificates (mutual TLS)"},

	// admission
	{path: "admission.ceiling", value: kvbudget.DefaultCeiling, doc: "fraction of GPU memory weights + KV may reach"},
	{path: "admission.reserve", value: byteSize(kvbudget.DefaultReserve), doc: "activation and runtime memory per GPU"},
	{path: "admission.mode", value: modeKV, doc: "kv or count"},
	{path: "admission.max_concurrency", value: 16, doc: "each backend's limit in count mode"},
	{path: "admission.reservation", value: admission.Predicted, doc: "predicted or worst_case"},
	{path: "admission.epsilon", value: admission.DefaultEpsilon, by: byAdmission, doc: "overflow probability per admission, predicted"},
	{path: "admission.resumable_epsilon", value: admission.DefaultResumableEpsilon, by: byAdmission, doc: "epsilon of a stream the guard can stop and resume"},
	{path: "admission.warmup_samples", value: admission.DefaultWarmupSamples, by: byAdmission, doc: "finished sequences before a model is predicted"},
	{path: "admission.headroom", value: admission.DefaultHeadroom, by: byAdmission, doc: "reported use that stops admission on the forecast"},
	{path: "admission.max_overcommit", value: admission.DefaultMaxOvercommit, by: byAdmission, doc: "worst cases admitted, in budgets"},
	{path: "admission.cool_down", value: admission.DefaultCoolDown, by: byAdmission, doc: "worst case held after a wrong forecast"},
	{path: "admission.resume_stopped", value: true, doc: "a stopped stream is resumed, not cut"},
	// The simulator notices an abort at its next step and vLLM at its next
	// token, tens of milliseconds; a second covers a backend under load with
	// room to spare.
	{path: "admission.abort_hold", value: time.Second, keepZero: true, doc: "reservation held after an early end"},
	{path: "admission.lengths_file.path", shown: "none (off)", doc: "learned output lengths kept across restarts"},
	{path: "admission.lengths_file.interval", value: 30 * time.Second, doc: "how often the lengths file is written"},
	{path: "admission.lengths_file.max_age", value: time.Hour, doc: "oldest lengths file read at start"},
	{path: "admission.backfill.enabled", value: true, doc: "requests that fit may pass a blocked head"},
	{path: "admission.preemption.enabled", value: true, doc: "a higher class may start on room of lower classes' resumable streams"},
	{path: "admission.preemption.after", value: admission.DefaultPreemptAfter, by: byAdmission, doc: "how long it waits for room first"},
	{path: "admission.backfill.max_head_age", value: admission.DefaultMaxHeadAge, by: byAdmission, doc: "a head this old is passed by nobody"},
	{path: "admission.pressure", value: admission.DefaultPressureThreshold, by: byAdmission, doc: "utilization above which sheddable classes are refused"},
	{path: "admission.queue.max_requests", value: admission.DefaultMaxQueued, by: byAdmission, doc: "waiting requests per class of each model"},
	{path: "admission.queue.max_bytes", value: admission.DefaultQueuedBytesFactor, shown: "%s × the model's budgets", by: byAdmission, doc: "worst-case bytes waiting per class of each model"},
	{path: "admission.queue.timeout", value: admission.DefaultQueueTimeout, by: byAdmission, doc: "longest wait"},
	{path: "admission.classes", shown: quotedNames(defaultClasses()), by: byDerived, whole: true, doc: "priority classes, highest first"},
	{path: "admission.default_class", value: admission.DefaultClass(defaultClasses()), shown: "`%s` (else the middle class)", by: byDerived, doc: "class of requests that name none"},
	{path: "admission.priority_header", value: defaultPriorityHeader, doc: "a request's class, at or below its tenant's"},
	{path: "admission.default_tenant_share", value: admission.DefaultShare, by: byAdmission, doc: "cap of tenants without a share of their own"},
	{path: "admission.drain_window", value: admission.DefaultDrainWindow, by: byAdmission, doc: "window of the release rate"},
	{path: "admission.max_retry_after", value: admission.DefaultMaxRetryAfter, by: byAdmission, doc: "cap of Retry-After"},
	{path: "admission.feedback.enabled", value: true, doc: "shrink a budget the backends overrun"},
	{path: "admission.feedback.decrease", value: admission.DefaultAIMDDecrease, by: byAdmission, doc: "decrease per report over the budget"},
	{path: "admission.feedback.increase", value: admission.DefaultAIMDIncrease, by: byAdmission, doc: "increase per report under it"},
	{path: "admission.feedback.min_fraction", value: admission.DefaultAIMDMinFraction, by: byAdmission, doc: "floor of the shrunk budget"},
	{path: "admission.reconcile.enabled", value: true, doc: "take memory nobody admitted off the budget"},
	{path: "admission.reconcile.tolerance", value: admission.DefaultReconcileTolerance, by: byAdmission, doc: "unaccounted fraction that does not count"},
	{path: "admission.reconcile.sustain", value: admission.DefaultReconcileSustain, by: byAdmission, doc: "how long a figure lasts before it counts"},

	// tenants[]
	{path: "tenants[].name", shown: "**required**", doc: "the tenant's name"},
	{path: "tenants[].api_keys", shown: "none", doc: "its bearer keys"},
	{path: "tenants[].class", shown: "`admission.default_class`", by: byDerived, doc: "the highest class its requests may use"},
	{path: "tenants[].share", shown: "`admission.default_tenant_share`", by: byAdmission, doc: "most of each budget it may hold"},
	{path: "tenants[].queue_share", shown: "`share`", by: byAdmission, doc: "its part of each class queue"},

	// models[]
	{path: "models[].name", shown: "**required**", doc: "the model's name"},
	{path: "models[].served_name", shown: "`name`", doc: "the name clients send instead"},
	{path: "models[].base", doc: "makes the model a LoRA adapter of this one"},
	{path: "models[].config", shown: "one of `config`/`geometry`", doc: "Hugging Face config.json"},
	{path: "models[].geometry", whole: true, doc: "KV geometry inline"},
	{path: "models[].weights_bytes", shown: "estimated from `config`", doc: "weight bytes of the whole model"},
	{path: "models[].tp", value: 1, doc: "tensor-parallel size"},
	{path: "models[].kv_dtype", shown: "`auto`", doc: "the backend's --kv-cache-dtype"},
	{path: "models[].block_size", value: kvbudget.DefaultBlockSize, doc: "the backend's KV block size in tokens"},
	{path: "models[].max_model_len", value: defaultMaxModelLen, shown: "the config's `max_position_embeddings`, else `%s`", by: byModel, doc: "prompt + output tokens"},
	{path: "models[].default_max_tokens", shown: "none", doc: "output reserved without max_tokens"},
	{path: "models[].tokenizer", value: "backend", doc: "backend or estimate"},
	{path: "models[].tokenize_cache", value: defaultTokenizeCache, doc: "cached /tokenize answers"},
	{path: "models[].estimate.template_tokens", value: 32, doc: "chat template's overhead per prompt"},
	{path: "models[].estimate.per_message_tokens", value: 16, doc: "overhead per message"},
	{path: "models[].estimate.per_tool_tokens", value: 32, doc: "overhead per tool definition"},
	{path: "models[].estimate.image_tokens", value: defaultImageTokens, shown: "the config's", by: byModel, doc: "tokens of one image"},
	{path: "models[].estimate.margin", value: 0.05, doc: "added on top of a calibrated estimate"},
	{path: "models[].estimate.calibration_window", value: 256, doc: "recent answers calibration fits"},
	{path: "models[].estimate.calibration_min", value: 32, doc: "answers calibration needs"},

	// backends[]
	{path: "backends[].name", shown: "**required**", doc: "the backend's name"},
	{path: "backends[].url", shown: "**required**", doc: "its server root"},
	{path: "backends[].models", shown: "**required**", doc: "model names it serves"},
	{path: "backends[].gpu", shown: "the backend's name", by: byDerived, doc: "the GPU whose budget it shares"},
	{path: "backends[].gpu_memory", shown: "required unless `kv_budget`", doc: "memory of one GPU, or nvml[:N]"},
	{path: "backends[].kv_budget", shown: "computed", doc: "the budget in bytes"},
	{path: "backends[].other_used", value: byteSize(0), doc: "memory other processes hold on the GPU"},
	{path: "backends[].gpu_device", shown: "`N` of `gpu_memory: nvml:N`, else the source's only device", doc: "the GPU's device for gpu_watch"},
	{path: "backends[].api_key", shown: "none", doc: "sent upstream as a bearer token"},
	{path: "backends[].tls.ca_file", shown: "the system's roots", doc: "CA of an https backend"},
	{path: "backends[].tls.server_name", shown: "the url's host", doc: "name its certificate must carry"},
	{path: "backends[].tls.insecure_skip_verify", value: false, doc: "accept any certificate"},
	{path: "backends[].tls.cert_file", shown: "none", doc: "the gateway's client certificate"},
	{path: "backends[].tls.key_file", shown: "none", doc: "its key"},
	{path: "backends[].max_connections", value: backends.DefaultMaxConns, by: byBackends, doc: "connections to the backend"},
	{path: "backends[].max_concurrency", shown: "`admission.max_concurrency`", by: byDerived, doc: "its limit in count mode"},
	{path: "backends[].prefix_caching", value: prefixCachingAuto, doc: "auto, on or off"},
	{path: "backends[].stream_usage", value: streamUsageContinuous, doc: "continuous or final"},
	{path: "backends[].first_byte_timeout", value: backends.DefaultFirstByteTimeout, by: byBackends, doc: "wait for a stream's first event"},
	{path: "backends[].kv_events", shown: "none", whole: true, doc: "the backend's KV events"},
	{path: "backends[].tokenize_timeout", value: backends.DefaultTokenizeTimeout, by: byBackends, doc: "one /tokenize call"},
	{path: "backends[].health.path", value: backends.DefaultHealthPath, by: byBackends, doc: "active health check"},
	{path: "backends[].health.interval", value: backends.DefaultHealthInterval, by: byBackends, doc: "between checks"},
	{path: "backends[].health.timeout", value: backends.DefaultHealthTimeout, by: byBackends, doc: "one check"},
	{path: "backends[].health.failures", value: backends.DefaultFailThreshold, by: byBackends, doc: "failures that open the circuit"},
	{path: "backends[].health.cooldown", value: backends.DefaultCooldown, by: byBackends, doc: "before a timed-out circuit half-opens"},
	{path: "backends[].metrics.path", value: backends.DefaultMetricsPath, by: byBackends, doc: "metrics scrape; - disables"},
	{path: "backends[].metrics.interval", value: backends.DefaultScrapeInterval, by: byBackends, doc: "between scrapes"},

	// tracing
	{path: "tracing.otlp_endpoint", shown: "empty: off", doc: "the collector's OTLP/HTTP URL"},
	{path: "tracing.service_name", value: "kvgate", doc: "the spans' service.name"},
	{path: "tracing.sample_ratio", value: 1.0, doc: "fraction of new traces kept"},
	{path: "tracing.headers", shown: "none", doc: "sent with every export"},

	// gpu_watch
	{path: "gpu_watch.source", value: gpuSourceAuto, doc: "auto, nvml, off or a URL"},
	{path: "gpu_watch.interval", value: defaultGPUInterval, keepZero: true, doc: "between readings"},
	{path: "gpu_watch.free_floor", value: byteSize(1 << 30), doc: "free memory a GPU must keep"},
	{path: "gpu_watch.residue_min", value: byteSize(1 << 30), doc: "used memory no process holds before it is residue"},
}

// quotedNames is the classes' names as the README lists them.
func quotedNames(classes []admission.ClassConfig) string {
	var names []string
	for _, c := range classes {
		names = append(names, "`"+c.Name+"`")
	}
	return strings.Join(names, ", ")
}

// defaultsIndex is configDefaults by path.
var defaultsIndex = func() map[string]*configDefault {
	m := make(map[string]*configDefault, len(configDefaults))
	for i := range configDefaults {
		m[configDefaults[i].path] = &configDefaults[i]
	}
	return m
}()

// defaultOf is the default of the key at path, which the table must hold.
func defaultOf[T any](path string) T {
	return defaultsIndex[path].value.(T)
}

// fillDefaults sets each key of section (a path of the table: "" for the
// top level, "server", "models[]") that v, a pointer to the section's
// struct, leaves absent to its default: every row with a value that no one
// else applies. A key is absent when it is zero (a nil pointer, "", 0, 0s),
// or, for a row that keeps a zero, when the file did not write it.
func fillDefaults(section string, v any) {
	root := reflect.ValueOf(v).Elem()
	for i := range configDefaults {
		d := &configDefaults[i]
		key, ok := strings.CutPrefix(d.path, section+".")
		if section == "" {
			key, ok = d.path, !strings.ContainsAny(d.path, ".[")
		}
		if !ok || d.value == nil || d.by != "" || strings.Contains(key, "[]") {
			continue
		}
		if f, ok := fieldAt(root, key); ok {
			d.fill(f)
		}
	}
}

// fieldAt is the field of struct v at key (its YAML names joined by dots);
// ok is false where a pointer on the way is nil: an optional section the
// file leaves out has no defaults to fill.
func fieldAt(v reflect.Value, key string) (reflect.Value, bool) {
	for name := range strings.SplitSeq(key, ".") {
		for v.Kind() == reflect.Pointer && v.Type().Elem().Kind() == reflect.Struct {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		idx, ok := yamlIndex(v.Type(), name)
		if !ok {
			panic(fmt.Sprintf("config default %s: no key %q in %s", key, name, v.Type()))
		}
		v = v.FieldByIndex(idx)
	}
	return v, true
}

// yamlIndex is the index of struct t's field whose YAML key is name.
func yamlIndex(t reflect.Type, name string) ([]int, bool) {
	for i := range t.NumField() {
		sf := t.Field(i)
		if isInline(sf) {
			if idx, ok := yamlIndex(sf.Type, name); ok {
				return append([]int{i}, idx...), true
			}
		} else if yamlName(sf) == name {
			return []int{i}, true
		}
	}
	return nil, false
}

// fill sets f, the field of d's key, to d.value if the file left it out.
func (d *configDefault) fill(f reflect.Value) {
	switch x := f.Addr().Interface().(type) {
	case *Duration:
		if (d.keepZero && !x.Written()) || (!d.keepZero && x.D == 0) {
			x.D = d.value.(time.Duration)
		}
	case *Size:
		if x.Bytes == 0 {
			x.Bytes = int64(d.value.(byteSize))
		}
	case **Size:
		if *x == nil {
			*x = &Size{Bytes: int64(d.value.(byteSize))}
		}
	case **bool:
		if *x == nil {
			on := d.value.(bool)
			*x = &on
		}
	case **float64:
		if *x == nil {
			r := d.value.(float64)
			*x = &r
		}
	default:
		if f.IsZero() {
			f.Set(reflect.ValueOf(d.value).Convert(f.Type()))
		}
	}
}

// shownValue is value as the README writes it: 30s, 2m, 8MiB, 0.05.
func shownValue(v any) string {
	switch x := v.(type) {
	case time.Duration:
		switch {
		case x >= time.Hour && x%time.Hour == 0:
			return fmt.Sprintf("%dh", x/time.Hour)
		case x >= time.Minute && x%time.Minute == 0:
			return fmt.Sprintf("%dm", x/time.Minute)
		}
		return x.String()
	case byteSize:
		for _, u := range []struct {
			name string
			size int64
		}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
			if x >= byteSize(u.size) && int64(x)%u.size == 0 {
				return fmt.Sprintf("%d%s", int64(x)/u.size, u.name)
			}
		}
		return fmt.Sprint(int64(x))
	case []string:
		return strings.Join(x, ", ")
	}
	return fmt.Sprint(v)
}
