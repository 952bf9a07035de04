package gateway

import "sync"

// shareCheck holds a GPU's count of shared prompt blocks to its backends'
// prefix-cache hits. Every block the gateway counts as shared is held by a
// running request when another is admitted onto it, so a backend that
// really shares finds it cached: its hits (in tokens) grow by at least the
// shared blocks' tokens, more with blocks cached from finished requests
// and other clients. Hits well short of that mean the gateway counted
// sharing the backend did not do — a label or an operator's `on` that is
// wrong, a backend restarted without its cache — and every such count is
// memory the backend holds twice while the gateway holds it once. So the
// GPU stops sharing, with a warning, until a reload.
type shareCheck struct {
	mu sync.Mutex // guards the window
	// The window: since when the counts are compared (the GPU's shared
	// blocks and its backends' hits at its start); based says one began.
	// last is the shared blocks at the previous report: the gateway counts
	// a block at admission, the backend its hit when it schedules the
	// request, after the next report may have been read, so each report's
	// hits answer for the blocks counted by the report before.
	based               bool
	blocks0, hits, last float64
}

// Sharing is refuted once the gateway has counted shareCheckBlocks shared
// blocks in a window and the backends' hits over it cover less than
// shareCheckCover of their tokens. The window then starts over, so that a
// backend that stops sharing after a long run is found as quickly. The
// cover leaves room for hits that come late (a request the backend keeps
// waiting is looked up when it is scheduled).
const (
	shareCheckBlocks = 32
	shareCheckCover  = 0.5
)

// observe compares the GPU's shared blocks so far (a counter) with the
// sum of its backends' hit counters, and says whether they refute its
// sharing; ok false when the backends report no counters (nothing to
// compare with). A counter that went back (a backend restarted) starts a
// new window.
func (c *shareCheck) observe(blocks, hits float64, blockSize int, ok bool) (refuted bool, counted, found float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok {
		c.based = false
		return false, 0, 0
	}
	if !c.based || blocks < c.last || hits < c.hits {
		c.based, c.blocks0, c.hits, c.last = true, blocks, hits, blocks
		return false, 0, 0
	}
	lagged := c.last
	c.last = blocks
	counted, found = (lagged-c.blocks0)*float64(blockSize), hits-c.hits
	if lagged-c.blocks0 < shareCheckBlocks {
		return false, counted, found
	}
	// The next window starts now on both sides: the hits in hand already
	// answer for the blocks counted since the previous report too.
	c.blocks0, c.hits = blocks, hits
	return found < shareCheckCover*counted, counted, found
}

// checkSharing holds g's shared blocks to its backends' hits, while it
// shares, and turns its sharing off when they refute it.
func (s *Server) checkSharing(rt *runtime, g *gpu) {
	if !g.sharing.Load() || g.refuted.Load() {
		return
	}
	st, ok := rt.sched.GPU(g.id)
	if !ok {
		return
	}
	var hits float64
	have, size := true, 0
	for _, b := range g.backends {
		kv, got := b.KV()
		if !got || !kv.HasPrefixCounters {
			have = false
			break
		}
		hits += kv.PrefixHits
		size = kv.BlockSize
	}
	refuted, counted, found := g.check.observe(float64(st.SharedBlocks), hits, size, have)
	if !refuted || g.refuted.Swap(true) {
		return
	}
	g.sharing.Store(false)
	if err := rt.sched.SetSharing(g.id, false); err != nil {
		s.log.Error("stop counting shared prompt blocks once", "gpu", g.name, "err", err)
	}
	s.log.Warn("a GPU's backends did not share the prompt blocks the gateway counted as shared (their prefix-cache hits fall short): every prompt counts whole there until a reload; check the backends' prefix caching, or set backends[].prefix_caching: off",
		"gpu", g.name, "counted_tokens", counted, "hit_tokens", found)
}
