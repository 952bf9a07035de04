package gateway

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"sync"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/backends"
)

// Shared prompt blocks. A backend with a prefix cache (vLLM's automatic
// prefix caching, on by default) holds a full prompt block once for every
// running request whose prompt begins with the same tokens, in the same
// block boundaries, for the same model (or LoRA adapter) and cache_salt.
// The gateway names each of a prompt's leading full blocks by a hash
// chained over its parent's and its own token ids, from a root of the
// model and the salt, so that two names are equal only where the backend
// would share; the GPU's admission table (admission.SetSharing) then
// counts each such block once.
//
// What it can see: the token ids of a fresh /tokenize answer (tokenizer:
// backend). A prompt counted from the tokenize cache, by the estimate, or
// given as token ids is reserved whole, sharing nothing: never an
// under-count, only a missed saving.
//
// A GPU shares only while every backend on it reports prefix caching on
// (vllm:cache_config_info's enable_prefix_caching) at the model's
// block_size, and no model runs on two of its backends (two processes
// hold two caches).

// promptChain names the leading full blocks of a prompt of ids for a
// model, into dst: dst[j] stands for blocks 0 to j. (salted gives the names
// a request's cache_salt makes of them.)
func promptChain(dst []uint64, seed maphash.Seed, model string, ids []uint32, blockSize int) []uint64 {
	if blockSize < 1 {
		return dst[:0]
	}
	prev := chainRoot(seed, model)
	dst = dst[:0]
	buf := make([]byte, 0, 8+4*blockSize)
	for j := 0; (j+1)*blockSize <= len(ids); j++ {
		prev = chainStep(seed, buf, prev, ids[j*blockSize:(j+1)*blockSize])
		dst = append(dst, prev)
	}
	return dst
}

// chainRoot is the parent name of a model's first prompt block.
func chainRoot(seed maphash.Seed, model string) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	writeLenPrefixed(&h, []byte(model))
	return h.Sum64()
}

// chainStep names the block of ids whose parent is named parent: its
// parent's name and its ids in one buffer (buf, reused), so one hash call
// per block, not per token. The KV-event index (kvChain) names the blocks
// a backend reports with it too, so that the two names meet.
func chainStep(seed maphash.Seed, buf []byte, parent uint64, ids []uint32) uint64 {
	buf = binary.LittleEndian.AppendUint64(buf[:0], parent)
	for _, id := range ids {
		buf = binary.LittleEndian.AppendUint32(buf, id)
	}
	return maphash.Bytes(seed, buf)
}

// idBufs are the buffers a /tokenize answer's token ids are read into:
// only the chain made of them is kept.
var idBufs = sync.Pool{New: func() any { b := make([]uint32, 0, 4096); return &b }}

// salted is chain as requests with cache_salt salt name it: the same
// chain for no salt, else each name mixed with the salt, so that two
// salts never name a block alike. It never writes chain (the tokenize
// cache's entries are read concurrently).
func salted(seed maphash.Seed, chain []uint64, salt string) []uint64 {
	if salt == "" {
		return chain
	}
	var h maphash.Hash
	h.SetSeed(seed)
	writeLenPrefixed(&h, []byte(salt))
	root := h.Sum64()
	out := make([]uint64, len(chain))
	var buf [16]byte
	for j, name := range chain {
		binary.LittleEndian.PutUint64(buf[:8], root)
		binary.LittleEndian.PutUint64(buf[8:], name)
		out[j] = maphash.Bytes(seed, buf[:])
	}
	return out
}

// setChain gives prompt i of the request its chain, as its cache_salt
// names it.
func (x *exchange) setChain(i int, chain []uint64) {
	if x.chains == nil {
		x.chains = make([][]uint64, len(x.req.shapes))
	}
	x.chains[i] = salted(x.s.prefixSeed, chain, x.req.cacheSalt)
}

// sharesAny says whether a GPU that may serve model holds shared prompt
// blocks once now: only then is a prompt's chain worth its token ids.
func (rt *runtime) sharesAny(model string) bool {
	if m := rt.models[model]; m != nil && m.kvEvents {
		return true // the index names a GPU's cached blocks alike
	}
	for _, g := range rt.gpus {
		if !g.sharing.Load() {
			continue
		}
		for _, b := range g.backends {
			for _, m := range b.Spec().Models {
				if m == model {
					return true
				}
			}
		}
	}
	return false
}

// shares says whether g's backends hold a shared prompt block once, as
// they last reported: every one with prefix caching on (its label, its
// hits, or the operator's word), at its models' block size, and no model
// on two of them; and nothing they reported since refuted it.
func (rt *runtime) shares(g *gpu) bool {
	if len(g.backends) == 0 || g.refuted.Load() {
		return false
	}
	seen := map[string]bool{}
	for _, b := range g.backends {
		kv, ok := b.KV()
		if !ok || rt.prefixOff[b] {
			return false
		}
		for _, name := range b.Spec().Models {
			m := rt.models[name]
			if seen[name] || m == nil || m.layout.BlockSize != kv.BlockSize {
				return false
			}
			seen[name] = true
			if !rt.prefixOn[b] && !kv.PrefixCaching && !hitsInBlocks(kv, m.layout.BlockSize) {
				return false
			}
		}
	}
	return true
}

// hitsInBlocks says whether a backend's prefix-cache counters show it
// shares: hits, in whole blocks of size tokens, as vLLM counts them.
func hitsInBlocks(kv backends.KVReport, size int) bool {
	return kv.HasPrefixCounters && kv.PrefixHits > 0 && size > 0 && math.Mod(kv.PrefixHits, float64(size)) == 0
}

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
