package gateway

import (
	"encoding/binary"
	"hash/maphash"
	"math"

	"github.com/valyala/fasthttp"

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
// What it can see: the token ids of a /tokenize answer (tokenizer:
// backend), whose chain the token cache keeps with the count. The count
// step (reservation.go) gives a request its chains. A prompt counted by
// the estimate, or given as token ids, is reserved whole, sharing nothing:
// never an under-count, only a missed saving.
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
