package sim

import (
	"bufio"

	"github.com/valyala/fasthttp"
)

// generate serves /v1/chat/completions (chat) and /v1/completions.
//
// A non-streamed request waits for its end and answers with one body; a
// client that hangs up meanwhile has its request aborted (connwatch). A
// streamed one waits for its first token (or its failure) before it commits
// to a 200, so that a request failed before any output gets a plain HTTP
// error; from then on every token is one SSE event (or several are:
// streamevents.go), written as soon as the engine has produced it; a hang-up (connwatch) or a failed write aborts
// the request and frees its blocks.
func (s *Server) generate(ctx *fasthttp.RequestCtx, chat bool) {
	p := s.parsers.Get()
	g, aerr := parseGenRequest(p, ctx.PostBody(), chat, s.set)
	s.parsers.Put(p)
	if aerr != nil {
		s.writeError(ctx, aerr)
		return
	}
	r := s.newRequest(g)
	if err := s.eng.submit(r); err != nil {
		s.writeError(ctx, errorFor(err))
		return
	}
	enc := newEncoder(chat, g.stream, s.newID(chat), s.now().Unix(), s.modelJSON)
	// Until the stream writer owns the connection, only a watch on it can
	// tell that the client left; then the request is aborted as vLLM aborts
	// it, its blocks freed at once.
	unwatch := s.watchHangup(ctx, r)
	if !g.stream {
		for r.status.Load() == statusActive {
			<-r.wake
		}
		unwatch()
		if r.status.Load() == statusFailed {
			s.writeError(ctx, errorFor(r.err))
			return
		}
		buf := s.getBuf()
		*buf = enc.full(*buf, r)
		ctx.SetContentType("application/json")
		ctx.SetBody(*buf)
		s.putBuf(buf)
		return
	}
	for r.status.Load() == statusActive && !r.started() {
		<-r.wake
	}
	if r.status.Load() == statusFailed && !r.started() {
		unwatch()
		s.writeError(ctx, errorFor(r.err))
		return
	}
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	// The watch stays on while the stream is written: a client that hangs
	// up is aborted at once, as vLLM aborts a request whose client
	// disconnected, rather than when a write finally fails — which behind
	// fasthttp's pipe, on a loaded machine, can be many steps later, while
	// the request goes on taking blocks. (fasthttp starts the writer at
	// once, so unwatch always runs.)
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer unwatch()
		s.stream(w, r, g, &enc)
	})
}

func (s *Server) newRequest(g genParams) *request {
	r := newRequest(g.promptTokens, g.maxTokens, g.n, s.now())
	if g.blocks.on() {
		r.cacheAs(&g.blocks, g.maxTokens)
	}
	for i := range r.seqs {
		sq := &r.seqs[i]
		sq.key = seqKey(g.key, i)
		sq.target = g.maxTokens
		if !g.ignoreEOS {
			dist := &s.set.outputLen
			if g.lengths != nil {
				dist = g.lengths
			}
			sq.target = max(dist.draw(sq.key, g.maxTokens), g.minTokens)
		}
	}
	return r
}

// started says whether any sequence of r has a token to send.
func (r *request) started() bool {
	for i := range r.seqs {
		if r.seqs[i].pub.Load() > 0 {
			return true
		}
	}
	return false
}

// stream writes r's events until it ends or the client goes away.
func (s *Server) stream(w *bufio.Writer, r *request, g genParams, enc *encoder) {
	buf := s.getBuf()
	defer s.putBuf(buf)
	sent := make([]int, len(r.seqs))
	first := true
	for {
		// The engine publishes tokens before the status, so once the
		// status says finished every token is visible.
		st := r.status.Load()
		b := (*buf)[:0]
		for i := range r.seqs {
			sq := &r.seqs[i]
			if first && enc.chat {
				b = enc.role(b, i, r.prompt, g.continuousUsage)
			}
			pub := int(sq.pub.Load())
			ended := pub >= sq.target || st != statusActive
			for end := s.set.nextEvent(sq.key, sent[i], pub, ended); end > 0; end = s.set.nextEvent(sq.key, sent[i], pub, ended) {
				finish := ""
				if end == sq.target {
					finish = finishReason(sq.target, g.maxTokens)
				}
				usage := -1
				if g.continuousUsage {
					usage = end
				}
				b = enc.token(b, i, sq.key, sent[i], end, finish, r.prompt, usage)
				sent[i] = end
			}
		}
		first = false
		switch st {
		case statusFinished:
			if g.includeUsage {
				total := 0
				for _, n := range sent {
					total += n
				}
				b = enc.usage(b, r.prompt, total)
			}
			b = appendDone(b)
		case statusFailed:
			b = appendErrorEvent(b, errorFor(r.err))
		}
		*buf = b
		if !s.sendEvents(w, b, r) {
			return
		}
		if st != statusActive {
			return
		}
		<-r.wake
	}
}

// sendEvents writes and flushes a stream's events (none: nothing to do);
// false, with r aborted, when the client is gone.
func (s *Server) sendEvents(w *bufio.Writer, b []byte, r *request) bool {
	if len(b) == 0 {
		return true
	}
	if _, err := w.Write(b); err != nil {
		s.eng.abort(r)
		return false
	}
	if err := w.Flush(); err != nil {
		s.eng.abort(r)
		return false
	}
	return true
}
