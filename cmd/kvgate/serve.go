package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/kvbudget"
)

// demoWeights is Llama-3-8B's bf16 weight bytes (8,030,261,248 params × 2).
const demoWeights = 16060522496

// demoConfig is the embedded demo: the gateway in front of one simulated
// Llama-3-8B on a 24 GiB GPU.
func demoConfig(listen, simURL string, corsOrigins []string) string {
	cors := ""
	if len(corsOrigins) > 0 {
		quoted := make([]string, len(corsOrigins))
		for i, o := range corsOrigins {
			quoted[i] = strconv.Quote(o)
		}
		cors = "server: {cors: {allowed_origins: [" + strings.Join(quoted, ", ") + "]}}\n"
	}
	return fmt.Sprintf(`listen: %s
%smodels:
  - name: llama-3-8b
    geometry: {layers: 32, kv_heads: 8, head_dim: 128, dtype: bfloat16}
    weights_bytes: %d
    max_model_len: 8192
    tokenizer: backend
backends:
  - name: sim0
    url: %s
    models: [llama-3-8b]
    gpu_memory: 24GiB
`, listen, cors, demoWeights, simURL)
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("serve", "[--config kvgate.yaml] [--listen ADDR] [--check-config [--json]]", stdout, stderr)
	cfgPath := fs.String("config", "", "gateway config file (YAML; ${VAR} and ${VAR:-default} read the environment); without it, an embedded demo runs: the gateway in front of an in-process simulated vLLM")
	check := fs.Bool("check-config", false, "validate --config as serve would (models, budgets, backends; NVML where asked), print what it gives, and exit: 0 valid, 2 not")
	asJSON := fs.Bool("json", false, "with --check-config: print the result as JSON")
	listen := fs.String("listen", "", "address to serve on, overriding the config's listen (default 127.0.0.1:8080)")
	simListen := fs.String("demo-sim-listen", "127.0.0.1:8000", "demo only: where the simulated backend listens")
	logLevel := fs.String("log-level", "", "debug, info, warn or error (overrides the config's log.level)")
	corsOrigin := fs.String("cors-origin", "", "demo only: origins whose browser pages may call the gateway, comma-separated (scheme://host[:port], or *); a config sets server.cors.allowed_origins")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	var origins []string
	if *corsOrigin != "" {
		if *cfgPath != "" {
			return fail(stderr, "serve", exitUsage, "--cors-origin is for the demo: with --config, set server.cors.allowed_origins")
		}
		for _, o := range strings.Split(*corsOrigin, ",") {
			origins = append(origins, strings.TrimSpace(o))
		}
	}
	if *check {
		return checkConfig(*cfgPath, *listen, *asJSON, stdout, stderr)
	}
	if *asJSON {
		return fail(stderr, "serve", exitUsage, "--json goes with --check-config")
	}

	var (
		cfg    *gateway.Config
		err    error
		demo   *sim.Server
		simURL string
	)
	if *cfgPath == "" {
		demo, simURL, err = startDemoSim(*simListen)
		if err != nil {
			return fail(stderr, "serve", exitNo, "demo backend: %v", err)
		}
		defer demo.Shutdown(context.Background())
		addr := *listen
		if addr == "" {
			addr = "127.0.0.1:8080"
		}
		cfg, err = gateway.Parse([]byte(demoConfig(addr, simURL, origins)), ".")
		if err != nil {
			if len(origins) > 0 {
				return fail(stderr, "serve", exitUsage, "--cors-origin: %v", err)
			}
			return fail(stderr, "serve", exitNo, "demo config: %v", err)
		}
	} else {
		cfg, err = loadConfig(*cfgPath, os.LookupEnv)
		if err != nil {
			return fail(stderr, "serve", exitUsage, "%v", err)
		}
		if *listen != "" {
			cfg.Listen = *listen
		}
	}
	if *logLevel != "" {
		cfg.Log.Level = *logLevel
	}
	logger, err := newLogger(stderr, cfg.Log)
	if err != nil {
		return fail(stderr, "serve", exitUsage, "%v", err)
	}
	// go-redis (shared_budget) logs through a process-wide logger of its own.
	redis.SetLogger(redisLogger{logger})
	srv, err := gateway.New(cfg, gateway.Options{Logger: logger, AccessLog: stderr})
	if err != nil {
		return fail(stderr, "serve", exitUsage, "%v", err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fail(stderr, "serve", exitNo, "listen: %v", err)
	}
	if demo != nil {
		fmt.Fprintf(stdout, `kvgate demo: gateway on http://%[1]s in front of a simulated vLLM (Llama-3-8B, 24 GiB GPU, %[2]d KV blocks) on %[3]s

Try:
  curl -s http://%[1]s/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model":"llama-3-8b","messages":[{"role":"user","content":"Hello!"}],"max_tokens":32}'

Budgets and queues: curl -s http://%[1]s/status    Metrics: http://%[1]s/metrics
The simulator fails every request with CUDA out of memory when over-admitted;
send load to %[3]s directly to see it, or through the gateway to see it not happen.
`, ln.Addr(), demo.Stats().NumGPUBlocks, simURL)
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	for {
		select {
		case err := <-errc:
			if err != nil {
				return fail(stderr, "serve", exitNo, "%v", err)
			}
			return exitOK
		case <-hup:
			if *cfgPath == "" {
				logger.Warn("SIGHUP: the demo has no config file to reload")
				continue
			}
			err := srv.ReloadFrom(func() (*gateway.Config, error) {
				next, err := loadConfig(*cfgPath, os.LookupEnv)
				if err == nil && *listen != "" {
					next.Listen = *listen
				}
				return next, err
			})
			if err != nil {
				logger.Error("reload refused; the running config stays", "err", err)
			} else {
				logger.Info("config reloaded", "file", *cfgPath)
			}
		case <-ctx.Done():
			began := time.Now()
			err := <-srv.Drain() // which says "shutting down"
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return fail(stderr, "serve", exitNo, "shutdown: %v", err)
			}
			logger.Info("stopped", "took", time.Since(began).Round(time.Millisecond).String(), "requests_cut", errors.Is(err, context.DeadlineExceeded))
			return exitOK
		}
	}
}

// startDemoSim runs the demo's simulated backend in-process, in real time.
// It allocates its KV pool at the gateway's ceiling (vLLM's
// --gpu-memory-utilization equal to admission.ceiling), so the gateway's
// budget is the whole pool: a backend started at vLLM's default 0.9 behind
// a 0.75 ceiling would keep memory nobody may use.
func startDemoSim(addr string) (*sim.Server, string, error) {
	cfg := sim.DefaultConfig()
	cfg.GPUMemoryUtilization = kvbudget.DefaultCeiling
	cfg.OnOverflow = sim.OverflowOOM
	cfg.Seed = 1
	s, err := sim.New(cfg)
	if err != nil {
		return nil, "", err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("listen %s: %w (choose another with --demo-sim-listen)", addr, err)
	}
	go s.Serve(ln)
	return s, "http://" + ln.Addr().String(), nil
}

// redisLogger routes go-redis's log lines into the gateway's slog logger,
// at debug level: they repeat on every failed dial while Redis is down,
// and the shared budget logs each change of state itself (unreachable,
// fallback, back).
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, "redis client", "msg", fmt.Sprintf(format, v...))
}

func newLogger(w io.Writer, c gateway.LogConfig) (*slog.Logger, error) {
	var level slog.Level
	if c.Level != "" {
		if err := level.UnmarshalText([]byte(c.Level)); err != nil {
			return nil, fmt.Errorf("log level %q: %w", c.Level, err)
		}
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// checkConfig is serve --check-config: the file is read and built exactly
// as serve would, and nothing is served.
func checkConfig(path, listen string, asJSON bool, stdout, stderr io.Writer) int {
	if path == "" {
		return fail(stderr, "serve", exitUsage, "--check-config needs --config FILE")
	}
	cfg, err := loadConfig(path, os.LookupEnv)
	if err != nil {
		return fail(stderr, "serve", exitUsage, "%v", err)
	}
	if listen != "" {
		cfg.Listen = listen
	}
	rep, err := gateway.Check(cfg, gateway.Options{})
	if err != nil {
		return fail(stderr, "serve", exitUsage, "config %s: %v", path, err)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return fail(stderr, "serve", exitNo, "%v", err)
		}
		return exitOK
	}
	fmt.Fprintf(stdout, "config %s is valid: listen %s; models %s; classes %s; %d tenant(s)\n",
		path, rep.Listen, strings.Join(rep.Models, ", "), strings.Join(rep.Classes, ", "), len(rep.Tenants))
	for _, g := range rep.GPUs {
		if g.MaxConcurrency > 0 {
			fmt.Fprintf(stdout, "  gpu %s: %d requests at once, backends %s\n", g.Name, g.MaxConcurrency, strings.Join(g.Backends, ", "))
			continue
		}
		fmt.Fprintf(stdout, "  gpu %s: KV budget %s, backends %s\n", g.Name, kvbudget.FormatBytes(g.BudgetBytes), strings.Join(g.Backends, ", "))
	}
	return exitOK
}
