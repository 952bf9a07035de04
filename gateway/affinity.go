package gateway

import (
	"hash/maphash"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// affinityPrefix is how much of a prompt's beginning keys its affinity
// when no session names it: about the first blocks' worth of tokens, where
// a shared system prompt or few-shot header sits and vLLM's prefix cache
// can serve it again.
const affinityPrefix = 1024

var affinitySeed = maphash.MakeSeed()

// affinity is the request's routing key under routing: affinity: its
// session header, else its user field, else a hash of its prompt's
// beginning (0 if it has none).
func (x *exchange) affinity(ctx *fasthttp.RequestCtx) uint64 {
	if v := ctx.Request.Header.Peek(x.rt.cfg.SessionHeader); len(v) > 0 {
		return maphash.Bytes(affinitySeed, v) | 1
	}
	if x.req.user != "" {
		return maphash.String(affinitySeed, x.req.user) | 1
	}
	if x.req.prefix != 0 {
		return x.req.prefix
	}
	return 0
}

// readAffinity notes what of body keys its affinity without a session:
// the user field, and a hash of the first affinityPrefix bytes of the
// first message's text or the first prompt.
func (r *request) readAffinity(v *fastjson.Value) {
	if u := v.Get("user"); u != nil && u.Type() == fastjson.TypeString {
		r.user = string(u.GetStringBytes())
	}
	var text []byte
	if r.kind == chatCompletions {
		if msgs := v.GetArray("messages"); len(msgs) > 0 {
			if c := msgs[0].Get("content"); c != nil && c.Type() == fastjson.TypeString {
				text = c.GetStringBytes()
			}
		}
	} else if p := v.Get("prompt"); p != nil {
		switch p.Type() {
		case fastjson.TypeString:
			text = p.GetStringBytes()
		case fastjson.TypeArray:
			if items := p.GetArray(); len(items) > 0 && items[0].Type() == fastjson.TypeString {
				text = items[0].GetStringBytes()
			}
		}
	}
	if len(text) > 0 {
		r.prefix = maphash.Bytes(affinitySeed, text[:min(len(text), affinityPrefix)]) | 1
	}
}
