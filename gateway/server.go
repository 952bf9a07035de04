package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/sharedbudget"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/backends/gpuinfo"
	"github.com/kvgate/kvgate/internal/accesslog"
	"github.com/kvgate/kvgate/internal/connwatch"
)

// Options are the Server's collaborators; zero values take the real ones.
type Options struct {
	Logger *slog.Logger
	// AccessLog, when set, takes the access lines (log.access) straight,
	// buffered, in log.format: what Logger's TextHandler or JSONHandler
	// would write to it, without their cost per line (package internal/accesslog). nil:
	// the lines go through Logger, whatever its handler.
	AccessLog io.Writer
	// Clock is the gateway's one source of time: admission deadlines and
	// Retry-After, the sweep's request and first-byte timeouts, latencies,
	// circuits, the backends' probes and /tokenize timeout, drain_delay.
	// Socket deadlines alone run on the wall clock. nil = the system clock.
	Clock admission.Clock
	// ProbeGPUs reads local GPUs for gpu_memory: nvml; nil = NVML.
	ProbeGPUs func() ([]gpuinfo.Device, error)
	// DisableProbes turns off the background health checks and scrapes,
	// for tests that drive backends by hand. Backends then start healthy.
	// It turns off the GPU memory watch's polling too (pollGPUs).
	DisableProbes bool
	// NVML is the library gpu_watch reads (auto, nvml); nil = the real one.
	// Tests pass go-nvml's mock.
	NVML nvml.Interface

	metrics  *metrics
	onDemand func(pool string) // the scheduler's OnDemand: the fleet's wake (shared_budget)
}

func (o *Options) observer() admission.Observer { return observer{m: o.metrics} }

func (o *Options) probeGPUs() ([]gpuinfo.Device, error) {
	if o.ProbeGPUs != nil {
		return o.ProbeGPUs()
	}
	return gpuinfo.Probe()
}

// reloadState is what Reload and Shutdown share: mu serialises them and
// guards the rest.
type reloadState struct {
	mu        sync.Mutex
	probeStop context.CancelFunc // ends the current runtime's probes
	closed    bool               // Shutdown began: no reload after it
	probes    sync.WaitGroup
}

// lifetime is the server's own: its contexts and the flags Drain and
// Shutdown set.
type lifetime struct {
	// ctx parents the contexts of the rarer paths (POST /tokenize) and
	// ends (errShutdown) with the server.
	ctx context.Context
	end context.CancelCauseFunc
	// lingerCtx ends when Shutdown begins: a lingering close (linger.go)
	// holds no shutdown up.
	lingerCtx context.Context
	endLinger context.CancelFunc
	stopping  atomic.Bool // Shutdown ends the requests in flight
	draining  atomic.Bool // Drain began: /readyz answers 503 (drain.go)
	stopOnce  sync.Once
}

// Server is the gateway: an OpenAI-compatible reverse proxy that admits
// requests by their predicted KV-cache bytes.
type Server struct {
	opt            Options
	log            *slog.Logger
	access         *accesslog.Writer // nil: access lines go through log
	lengths        *lengthsFile      // nil: admission.lengths_file is off
	now            func() time.Time
	m              *metrics
	srv            *fasthttp.Server
	watch          *connwatch.Watcher
	parsers        fastjson.ParserPool
	metricsHandler fasthttp.RequestHandler
	conns          *connLimit // server.max_connections
	// tls is the listener's TLS (server.tls), nil for plain HTTP. Set once
	// by New; its certificate changes with reloads.
	tls *listenerTLS

	rt atomic.Pointer[runtime]
	// counting remembers the backends that stream several tokens an
	// event (tally.go).
	counting eventCounting
	// tokenizeWarn limits the warning of a /tokenize that failed (the
	// prompt estimated) to one a minute.
	tokenizeWarn warnLimit
	// sched is the admission scheduler every runtime shares; set once by New.
	sched *admission.Scheduler
	// shared shares the budgets with other replicas (shared_budget); nil
	// when the budget is this process's alone. Set once by New.
	shared *sharedbudget.Replica

	reloads reloadState

	// budgetMu makes a runtime's budget update (setBudget) and a reload's
	// swap of the runtime one step each: a KV report of the runtime being
	// replaced, read before the swap, must not resize the scheduler after
	// the new runtime's Reconfigure gave it the new budget.
	budgetMu sync.Mutex
	// kv runs the backends' KV-event subscribers (kvevents.go).
	kv kvWatch

	// flights are the requests in flight, swept while there are any
	// (inflight.go): their deadlines, their clients' watches, shutdown.
	flights inflight
	life    lifetime

	active atomic.Int64 // exchanges between arrival and finish
	// prefixSeed seeds the names of prompt blocks (prefix.go): random per
	// process, so that no client can aim a prompt at another's name.
	prefixSeed maphash.Seed
	reports    reportMemo
	backendLog *backendLog // changes of backends' states and GPUs' budgets, logged once each
	tracing    tracing     // span export (trace.go)
	gpuWatch   *gpuWatch   // what else is on each GPU (gpuwatch.go); set once by New

	// routes is the table of routes the dispatch reads (routes.go).
	routes *routes

	// testHookServe, when set by a test, runs at the start of every
	// completion request (to inject a panic, say).
	testHookServe func()
}

// New builds a Server from a validated config.
func New(cfg *Config, opt Options) (*Server, error) {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.Clock == nil {
		opt.Clock = admission.SystemClock()
	}
	s := &Server{opt: opt, log: opt.Logger, now: opt.Clock.Now, backendLog: newBackendLog(opt.Logger), prefixSeed: maphash.MakeSeed(), tokenizeWarn: warnLimit{every: time.Minute},
		routes: defaultRoutes}
	if opt.AccessLog != nil {
		s.access = accesslog.NewWriter(opt.AccessLog, cfg.Log.Format, func(d time.Duration, f func()) { opt.Clock.AfterFunc(d, f) })
	}
	s.m = newMetrics(s.rt.Load, s.now)
	s.m.reg.MustRegister(&kvEventsCollector{w: &s.kv})
	s.opt.metrics = s.m
	s.gpuWatch = newGPUWatch(cfg.GPUWatch, opt.NVML, s.log, s.now)
	if s.gpuWatch.src != nil {
		s.m.reg.MustRegister(gpuCollector{w: s.gpuWatch, current: s.rt.Load})
	}
	if sb := cfg.SharedBudget; sb != nil {
		rtt := newRedisRTT()
		s.shared = sharedbudget.New(sb, sharedbudget.Deps{Clock: s.opt.Clock, Logger: s.log, FallbackGrace: cfg.Server.RequestTimeout.D,
			Observe: rtt.observe})
		s.opt.onDemand = s.shared.Wake
		s.m.reg.MustRegister(rtt.h, sharedBudgetCollector{f: s.shared})
	}
	rt, commit, err := buildRuntime(cfg, nil, &s.opt, nil)
	if err == nil {
		s.sched, err = commit()
		if err != nil {
			err = fmt.Errorf("gateway: admission: %w", err)
		}
	}
	var w *connwatch.Watcher
	if err == nil {
		if w, err = connwatch.New(); err != nil {
			err = fmt.Errorf("gateway: %w", err)
		}
	}
	if err != nil {
		if s.shared != nil {
			s.shared.Close()
		}
		s.gpuWatch.closeOnce()
		return nil, err
	}
	s.watch = w
	s.life.ctx, s.life.end = context.WithCancelCause(context.Background())
	s.life.lingerCtx, s.life.endLinger = context.WithCancel(context.Background())
	s.flights.wake, s.flights.sweepStop, s.flights.sweepDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	s.flights.epoch = s.now()
	go s.sweepLoop(s.flights.sweepStop)
	s.rt.Store(rt)
	s.lengths = s.startLengthsFile(cfg, rt) // before anything is admitted
	if s.shared != nil {
		if err := s.shared.Start(s.sched, func() []string { return s.rt.Load().modelOrder }, rt.sharedGPUs()); err != nil {
			s.shared.Close()
			w.Close()
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	if err := s.tracing.apply(cfg.Tracing, s.log); err != nil {
		s.log.Error("tracing: no span will be exported", "err", err)
	}
	s.metricsHandler = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	sc := cfg.Server
	s.conns = &connLimit{limit: int64(sc.MaxConnections)}
	if sc.TLS != nil {
		s.tls = newListenerTLS(sc.TLS)
	}
	s.srv = &fasthttp.Server{
		Handler:                       s.handle,
		ErrorHandler:                  s.handleServerError,
		Name:                          "kvgate",
		MaxRequestBodySize:            int(sc.MaxBodyBytes.Bytes),
		ReadBufferSize:                int(sc.MaxHeaderBytes.Bytes), // fasthttp's bound on a request's line and headers
		ReadTimeout:                   sc.ReadTimeout.D,
		WriteTimeout:                  sc.WriteTimeout.D,
		IdleTimeout:                   sc.IdleTimeout.D,
		Concurrency:                   sc.MaxConnections + probeHeadroom(sc.MaxConnections),
		ConnState:                     s.conns.state,
		CloseOnShutdown:               true,
		NoDefaultContentType:          true,
		DisableHeaderNamesNormalizing: false,
		Logger:                        slogPrintf{s.log},
	}
	s.startProbes(rt)
	return s, nil
}

// slogPrintf adapts fasthttp's logger to slog, without the request bytes
// fasthttp quotes in its errors (they carry clients' keys).
type slogPrintf struct{ l *slog.Logger }

func (p slogPrintf) Printf(format string, args ...any) {
	p.l.Warn("fasthttp", "error", redact(fmt.Sprintf(format, args...)))
}

// Serve serves on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if s.tls != nil {
		leaf := s.tls.leaf()
		s.log.Info("kvgate listening", "addr", ln.Addr().String(), "tls", true,
			"certificate", leaf.Subject.String(), "not_after", leaf.NotAfter)
		return s.srv.Serve(s.tls.wrap(ln))
	}
	s.log.Info("kvgate listening", "addr", ln.Addr().String())
	return s.srv.Serve(ln)
}

// withTimeout is context.WithTimeout on the Options' clock. Its Err says
// Canceled either way; context.Cause tells DeadlineExceeded apart, and the
// upstream's errors report the cause.
func (s *Server) withTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	t := s.opt.Clock.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return ctx, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// endRequests ends every request in flight, and any that arrives after,
// with errShutdown.
func (s *Server) endRequests() {
	s.life.stopping.Store(true)
	s.flights.each(func(x *exchange) { x.rctx.cancel(errShutdown) })
	s.life.end(errShutdown)
}

// Shutdown stops accepting connections, waits for in-flight requests
// (streams included) until ctx ends, then stops the background probes.
func (s *Server) Shutdown(ctx context.Context) error {
	s.life.endLinger()
	err := s.srv.ShutdownWithContext(ctx)
	s.reloads.mu.Lock()
	s.reloads.closed = true
	if s.reloads.probeStop != nil {
		s.reloads.probeStop()
	}
	s.reloads.probes.Wait()
	s.stopKVEvents()
	s.reloads.mu.Unlock()
	s.gpuWatch.closeOnce()
	s.endRequests()
	// What was still running is cancelled now; give it a moment to answer
	// its clients (503) and give its reservations back. The moment is wall
	// time, as ctx's deadline is: it bounds how long the caller (a process
	// on its way out) is held, which a manual clock must not stretch.
	for deadline := time.Now().Add(2 * time.Second); s.active.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if s.shared != nil {
		s.shared.Close() // drained: give the leases back
	}
	s.life.stopOnce.Do(func() {
		close(s.flights.sweepStop)
		<-s.flights.sweepDone
	})
	s.watch.Close()
	s.tracing.close() // the spans of the requests just drained
	s.lengths.stop()  // with what the requests just drained taught
	if s.access != nil {
		s.access.Flush() // the lines of the requests just drained
	}
	return err
}

// Reload swaps in a new configuration. In-flight requests finish under the
// runtime they started with; budgets and backends that persist keep their
// reservations, queues and connections. On error nothing changes.
func (s *Server) Reload(cfg *Config) error {
	s.reloads.mu.Lock()
	defer s.reloads.mu.Unlock()
	if s.reloads.closed {
		return errors.New("gateway: reload after shutdown")
	}
	old := s.rt.Load()
	if cfg.Listen != old.cfg.Listen {
		s.log.Warn("listen address changes need a restart; keeping the old one", "old", old.cfg.Listen, "new", cfg.Listen)
		cfg.Listen = old.cfg.Listen
	}
	// The HTTP server's limits are fixed when it starts; keeping the old
	// section keeps request_timeout and write_timeout in step with them.
	// Its TLS files are the exception: rotating a certificate must not
	// need a restart.
	newTLS := cfg.Server.TLS
	if !cfg.Server.sameAs(old.cfg.Server) {
		s.log.Warn("server.* changes need a restart; keeping the running server section (server.tls apart)")
		cfg.Server = old.cfg.Server
	}
	cfg.Server.TLS = newTLS
	if (newTLS == nil) != (s.tls == nil) {
		s.log.Warn("turning server.tls on or off needs a restart; keeping the listener as it is")
		cfg.Server.TLS = old.cfg.Server.TLS
	}
	if !cfg.SharedBudget.SameAs(old.cfg.SharedBudget) {
		s.log.Warn("shared_budget changes need a restart; keeping the running shared_budget section")
	}
	cfg.SharedBudget = old.cfg.SharedBudget // the running replica's name too
	if cfg.GPUWatch.Source != old.cfg.GPUWatch.Source {
		s.log.Warn("gpu_watch.source changes need a restart; keeping the running source", "old", old.cfg.GPUWatch.Source, "new", cfg.GPUWatch.Source)
		cfg.GPUWatch.Source = old.cfg.GPUWatch.Source
	}
	rt, commit, err := buildRuntime(cfg, old, &s.opt, s.sched)
	s.budgetMu.Lock()
	if err == nil {
		_, err = commit()
	}
	if err == nil {
		s.rt.Store(rt)
	}
	s.budgetMu.Unlock()
	if err != nil {
		s.m.reloaded(false, s.now())
		return err
	}
	s.m.reloaded(true, s.now())
	if err := s.tracing.apply(cfg.Tracing, s.log); err != nil {
		s.log.Error("tracing: keeping the running exporter", "err", err)
	}
	if s.tls != nil && cfg.Server.TLS != old.cfg.Server.TLS {
		s.tls.set(cfg.Server.TLS)
		leaf := s.tls.leaf()
		s.log.Info("serving the reloaded TLS certificate to new connections", "certificate", leaf.Subject.String(),
			"serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
	}
	if s.shared != nil {
		if err := s.shared.Sync(rt.sharedGPUs()); err != nil {
			s.log.Error("shared budget: a new GPU's lease could not start; it admits nothing", "err", err)
		}
	}
	s.startProbesLocked(rt)
	return nil
}

func (s *Server) startProbes(rt *runtime) {
	s.reloads.mu.Lock()
	defer s.reloads.mu.Unlock()
	s.startProbesLocked(rt)
}

func (s *Server) startProbesLocked(rt *runtime) {
	s.syncKVEvents(rt)
	if s.reloads.probeStop != nil {
		// The old generation must be gone before the new one starts: a
		// scrape finishing late would apply the old runtime's numbers to
		// budgets the new one shares.
		s.reloads.probeStop()
		s.reloads.probes.Wait()
	}
	if s.opt.DisableProbes {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.reloads.probeStop = cancel
	if s.gpuWatch.src != nil {
		s.reloads.probes.Add(1)
		go func() {
			defer s.reloads.probes.Done()
			s.runGPUWatch(ctx)
		}()
	}
	s.reloads.probes.Add(1)
	go func() {
		defer s.reloads.probes.Done()
		_ = rt.upstreams.Run(ctx, func(b *backends.Backend, r backends.KVReport, ok bool) { s.onKVReport(rt, b, r, ok) })
	}()
}

// handleServerError answers what fasthttp refuses before a handler runs.
// fasthttp's error text quotes the request it could not read, headers and
// keys included, so none of it is echoed.
func (s *Server) handleServerError(ctx *fasthttp.RequestCtx, err error) {
	stampRequestID(ctx)
	sc := s.rt.Load().cfg.Server
	var small *fasthttp.ErrSmallBuffer
	var te interface{ Timeout() bool }
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		(&apiError{status: 413, typ: typeInvalidRequest, code: "request_too_large",
			message: fmt.Sprintf("The request body is larger than the %d bytes this gateway accepts.", sc.MaxBodyBytes.Bytes)}).write(ctx)
		s.lingerClose(ctx, sc.ReadTimeout.D)
	case errors.As(err, &small) || errors.Is(err, fasthttp.ErrSmallReadBuffer):
		(&apiError{status: 431, typ: typeInvalidRequest, code: "request_header_too_large",
			message: fmt.Sprintf("The request line and headers are larger than the %d bytes this gateway accepts (server.max_header_bytes).", sc.MaxHeaderBytes.Bytes)}).write(ctx)
		s.lingerClose(ctx, sc.ReadTimeout.D)
	case errors.As(err, &te) && te.Timeout():
		(&apiError{status: 408, typ: typeInvalidRequest, code: "request_timeout", message: "Timed out reading the request."}).write(ctx)
	default:
		(&apiError{status: 400, typ: typeInvalidRequest, code: "bad_request", message: "Malformed HTTP request."}).write(ctx)
	}
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		(&apiError{status: 500, typ: typeServer, message: err.Error()}).write(ctx)
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// serveModels lists the configured models as OpenAI does, with vLLM's
// max_model_len; with an id, it answers that model alone (the clients'
// models.retrieve). Like OpenAI, it needs a key once tenants have keys:
// clients check a key with models.list().
func (s *Server) serveModels(ctx *fasthttp.RequestCtx, id string) {
	rt := s.rt.Load()
	if _, ok := rt.authenticate(ctx); !ok {
		unauthorized().write(ctx)
		return
	}
	type entry struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Created     int64  `json:"created"`
		OwnedBy     string `json:"owned_by"`
		MaxModelLen int    `json:"max_model_len"`
	}
	model := func(m *model) entry {
		return entry{ID: m.servedName, Object: "model", Created: 0, OwnedBy: "kvgate", MaxModelLen: m.maxLen}
	}
	if id != "" {
		m := rt.byClientName[id]
		if m == nil {
			unknownModel(id).write(ctx)
			return
		}
		writeJSON(ctx, 200, model(m))
		return
	}
	out := struct {
		Object string  `json:"object"`
		Data   []entry `json:"data"`
	}{Object: "list", Data: []entry{}}
	for _, name := range rt.modelOrder {
		out.Data = append(out.Data, model(rt.models[name]))
	}
	writeJSON(ctx, 200, out)
}
