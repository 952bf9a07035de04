package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/connwatch"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"github.com/valyala/fastjson"
)

// Server is a simulated vLLM OpenAI-compatible server: an engine (see
// engine.go) behind fasthttp. Create it with New, run it with Serve, and
// always end it with Shutdown, which also stops the engine's goroutine.
type Server struct {
	set     *settings
	eng     *engine
	met     *metrics
	http    *fasthttp.Server
	scrape  fasthttp.RequestHandler // /metrics over met's registry
	parsers fastjson.ParserPool
	bufs    sync.Pool // *[]byte response buffers
	now     func() time.Time
	watch   *connwatch.Watcher // nil: hang-ups of waiting clients go unnoticed
	events  *eventPublisher    // nil: no KV events
	vocab   *vocab             // what /detokenize reads back

	modelJSON []byte
	created   int64         // Unix time of New, for /v1/models
	idSalt    uint64        // makes ids differ between servers
	idSeq     atomic.Uint64 // request ids

	stop     chan struct{}
	loopDone chan struct{}

	mu        sync.Mutex // guards closed and listeners; a leaf lock
	closed    bool
	listeners []net.Listener
}

// New builds a server from cfg and starts its engine. It fails with a
// *ConfigError naming the field when cfg cannot be served, e.g. when the
// weights leave no room for one sequence of MaxModelLen.
func New(cfg Config) (*Server, error) {
	set, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	s := &Server{set: set, now: time.Now, modelJSON: jsonString(set.model),
		stop: make(chan struct{}), loopDone: make(chan struct{}), vocab: newVocab()}
	s.created = s.now().Unix()
	s.idSalt = mix(uint64(s.now().UnixNano()))
	s.eng = newEngine(set, s.now, engineHooks{})
	s.met = newMetrics(set, s.eng.stats)
	s.eng.hooks = engineHooks{
		finished: s.met.finished,
		oom: func(err error) {
			set.logger.Warn("simulated CUDA out of memory: failing every request in flight",
				"err", err, "restart", set.pace.oomRestart, "time_scale", set.pace.timeScale)
		},
	}
	s.scrape = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(s.met.reg, promhttp.HandlerOpts{}))
	if s.watch, err = connwatch.New(); err != nil {
		set.logger.Warn("client hang-ups will go unnoticed until a write fails", "err", err)
		s.watch = nil
	}
	s.http = &fasthttp.Server{
		Handler:               s.route,
		Name:                  "kvgate-sim",
		NoDefaultServerHeader: true,
		CloseOnShutdown:       true,
		Logger:                fasthttpLogger{set.logger},
	}
	if set.kvEvents != nil {
		if s.events, err = startPublisher(*set.kvEvents, s.eng.events, set.logger); err != nil {
			return nil, err
		}
	}
	go func() {
		defer close(s.loopDone)
		s.eng.run(s.stop)
	}()
	set.logger.Info("simulated vLLM server ready", "model", set.model,
		"num_gpu_blocks", set.numBlocks, "block_size", set.blockSize, "kv_tokens", set.numBlocks*int64(set.blockSize),
		"max_model_len", set.maxModelLen, "prefix_caching", set.prefixCaching, "on_overflow", map[bool]string{false: OverflowPreempt, true: OverflowOOM}[set.oom])
	return s, nil
}

// Serve answers requests on ln until Shutdown; it returns nil after
// Shutdown and the listener's error otherwise.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ln.Close()
		return nil
	}
	s.listeners = append(s.listeners, ln)
	s.mu.Unlock()
	err := s.http.Serve(ln)
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil
	}
	return err
}

// Shutdown stops accepting connections and waits, until ctx ends, for the
// requests in flight to finish; what is still running then fails with
// "the server is shutting down" (HTTP 503, or an error event in a stream).
// The engine stops in either case. It returns ctx's error on timeout.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	already := s.closed
	s.closed = true
	lns := s.listeners
	s.mu.Unlock()
	if already {
		return nil
	}
	err := s.http.ShutdownWithContext(ctx)
	if err != nil {
		s.eng.shutdown() // the engine loop still runs: nothing new is admitted
		// The handlers end now; give them a moment to write their errors
		// and let fasthttp close their connections.
		c2, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.http.ShutdownWithContext(c2)
		cancel()
	}
	for _, ln := range lns {
		_ = ln.Close() // closes a listener Serve had not yet handed to fasthttp
	}
	close(s.stop)
	<-s.loopDone
	s.eng.shutdown()
	if s.events != nil {
		s.events.close()
	}
	if s.watch != nil {
		if cerr := s.watch.Close(); cerr != nil {
			s.set.logger.Warn("closing the connection watcher", "err", cerr)
		}
	}
	return err
}

// KVEventsAddr is the host:port the KV events' PUB socket listens on, ""
// when the server publishes none.
func (s *Server) KVEventsAddr() string {
	if s.events == nil {
		return ""
	}
	return s.events.Addr()
}

// KVEventsReplayAddr is the host:port of the KV events' replay socket, ""
// when there is none.
func (s *Server) KVEventsReplayAddr() string {
	if s.events == nil {
		return ""
	}
	return s.events.ReplayAddr()
}

// Stats is a snapshot of the engine; the same numbers are on /metrics.
func (s *Server) Stats() Stats { return s.eng.stats() }

func (s *Server) route(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path()) // the compiler does not allocate for a switch
	switch path {
	case "/v1/chat/completions":
		s.post(ctx, func(ctx *fasthttp.RequestCtx) { s.generate(ctx, true) })
	case "/v1/completions":
		s.post(ctx, func(ctx *fasthttp.RequestCtx) { s.generate(ctx, false) })
	case "/v1/responses":
		s.post(ctx, func(ctx *fasthttp.RequestCtx) { s.generateAPI(ctx, apiResponses) })
	case "/v1/messages":
		s.post(ctx, func(ctx *fasthttp.RequestCtx) { s.generateAPI(ctx, apiMessages) })
	case "/v1/messages/count_tokens":
		s.post(ctx, s.countTokens)
	case "/tokenize":
		if s.set.api.noTokenize {
			s.notFound(ctx)
			return
		}
		s.post(ctx, s.tokenize)
	case "/detokenize":
		s.post(ctx, s.detokenize)
	case "/v1/embeddings":
		s.post(ctx, func(ctx *fasthttp.RequestCtx) { s.pool(ctx, poolEmbed) })
	case "/pooling":
		s.post(ctx, func(ctx *fasthttp.RequestCtx) { s.pool(ctx, poolPooling) })
	case "/classify":
		s.post(ctx, func(ctx *fasthttp.RequestCtx) { s.pool(ctx, poolClassify) })
	case "/score", "/v1/score":
		s.post(ctx, func(ctx *fasthttp.RequestCtx) { s.pool(ctx, poolScore) })
	case "/rerank", "/v1/rerank", "/v2/rerank":
		s.post(ctx, func(ctx *fasthttp.RequestCtx) { s.pool(ctx, poolRerank) })
	case "/v1/models":
		s.get(ctx, s.models)
	case "/health":
		s.get(ctx, s.health)
	case "/metrics":
		s.get(ctx, s.scrape)
	default:
		s.notFound(ctx)
	}
}

func (s *Server) notFound(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusNotFound)
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"detail":"Not Found"}`)
}

func (s *Server) post(ctx *fasthttp.RequestCtx, h fasthttp.RequestHandler) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	h(ctx)
}

func (s *Server) get(ctx *fasthttp.RequestCtx, h fasthttp.RequestHandler) {
	if !ctx.IsGet() && !ctx.IsHead() {
		methodNotAllowed(ctx, "GET")
		return
	}
	h(ctx)
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set("Allow", allow)
	ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"detail":"Method Not Allowed"}`)
}

func (s *Server) writeError(ctx *fasthttp.RequestCtx, e *apiError) {
	ctx.SetStatusCode(e.status)
	ctx.SetContentType("application/json")
	ctx.SetBody(e.appendJSON(nil))
}

func (s *Server) health(ctx *fasthttp.RequestCtx) {
	if !s.eng.healthy() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
}

func (s *Server) models(ctx *fasthttp.RequestCtx) {
	b := make([]byte, 0, 512)
	created := strconv.AppendInt(nil, s.created, 10)
	b = append(b, `{"object":"list","data":[{"id":`...)
	b = append(b, s.modelJSON...)
	b = append(b, `,"object":"model","created":`...)
	b = append(b, created...)
	b = append(b, `,"owned_by":"vllm","root":`...)
	b = append(b, s.modelJSON...)
	b = append(b, `,"parent":null,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(s.set.maxModelLen), 10)
	b = append(b, `,"permission":[{"id":"modelperm-`...)
	b = strconv.AppendUint(b, s.idSalt, 16)
	b = append(b, `","object":"model_permission","created":`...)
	b = append(b, created...)
	b = append(b, `,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}]}`...)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

func (s *Server) tokenize(ctx *fasthttp.RequestCtx) {
	p := s.parsers.Get()
	t, aerr := parseTokenize(p, ctx.PostBody(), s.set, s.vocab)
	s.parsers.Put(p)
	if aerr != nil {
		s.writeError(ctx, aerr)
		return
	}
	b := make([]byte, 0, 64+8*len(t.prompt.ids))
	b = append(b, `{"count":`...)
	b = strconv.AppendInt(b, int64(t.prompt.tokens), 10)
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(s.set.maxModelLen), 10)
	b = append(b, `,"tokens":[`...)
	for i, id := range t.prompt.ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	b = append(b, `],"token_strs":`...)
	if t.prompt.strsToo {
		b = append(b, '[')
		for i, str := range t.prompt.strs {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, jsonString(str)...)
		}
		b = append(b, ']')
	} else {
		b = append(b, `null`...)
	}
	b = append(b, '}')
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// detokenize answers vLLM's /detokenize: {"prompt": text}. Special tokens
// are decoded as their text, as vLLM's decode leaves them. An id no piece
// the simulator has tokenized or generated holds is refused, naming it:
// the simulator knows only the pieces it has met (vocab.go).
func (s *Server) detokenize(ctx *fasthttp.RequestCtx) {
	p := s.parsers.Get()
	ids, aerr := parseDetokenize(p, ctx.PostBody(), s.set)
	s.parsers.Put(p)
	if aerr != nil {
		s.writeError(ctx, aerr)
		return
	}
	text, bad, ok := s.vocab.decode(ids)
	if !ok {
		s.writeError(ctx, badRequest("tokens", "Token id %d is not one the simulator has produced: it decodes the ids that /tokenize has answered and those of the text it generates", bad))
		return
	}
	b := append([]byte(`{"prompt":`), jsonString(text)...)
	b = append(b, '}')
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// newID is a request id: unique per server, different between servers.
func (s *Server) newID(chat bool) string {
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	n := s.idSeq.Add(1)
	var b [48]byte
	out := append(b[:0], prefix...)
	out = appendHex64(out, mix(s.idSalt^n))
	out = appendHex64(out, mix(s.idSalt+n))
	return string(out)
}

func appendHex64(dst []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	for i := 60; i >= 0; i -= 4 {
		dst = append(dst, digits[(v>>uint(i))&15])
	}
	return dst
}

func (s *Server) getBuf() *[]byte {
	if b, ok := s.bufs.Get().(*[]byte); ok {
		*b = (*b)[:0]
		return b
	}
	b := make([]byte, 0, 16<<10)
	return &b
}

func (s *Server) putBuf(b *[]byte) {
	if cap(*b) <= 1<<20 { // do not keep the odd huge response alive
		s.bufs.Put(b)
	}
}

// fasthttpLogger sends fasthttp's own complaints to slog.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Warn(fmt.Sprintf(format, args...), "component", "fasthttp")
}

// watchHangup aborts r the moment the client of ctx hangs up, while the
// handler waits on r without touching the connection. The returned stop must
// be called before the handler returns. Where the connection cannot be
// watched (an in-memory listener, no epoll) it does nothing.
func (s *Server) watchHangup(ctx *fasthttp.RequestCtx, r *request) (stop func()) {
	if s.watch == nil {
		return func() {}
	}
	unwatch, err := s.watch.Watch(ctx.Conn(), func() { s.eng.cancel(r, errClientGone) })
	if err != nil {
		return func() {}
	}
	return func() { unwatch() }
}

// errorFor is the HTTP error a failed request gets.
func errorFor(err error) *apiError {
	if errors.Is(err, errUnhealthy) || errors.Is(err, errShutdown) {
		return unavailable(err)
	}
	return serverError(err)
}
