package admission

// Binding by cache. A GPU's backends keep a prompt's blocks cached after
// the requests that computed them end (vLLM's prefix cache frees them to
// an LRU list, not to oblivion), and a request whose leading blocks are
// cached there skips their prefill. The gateway's own table (share.go)
// sees only the blocks its running tickets hold; a CacheView sees what the
// backends say they hold (their KV events), so a request can go where it
// must compute least.
//
// Cost: first the blocks the request must prefill on the GPU (its
// prompt's, less the leading ones cached there; the block of the prompt's
// last token is computed anyway), then the blocks the GPU's admitted
// requests hold (its load), then the most room; among the GPUs where it
// fits under the usual rules. NVIDIA Dynamo's KV router adds the two
// counts instead (overlap weight × blocks to prefill + active blocks,
// weight 1 by default); this order is that score with an unbounded
// weight. Measured on bench/kvcache's sessions (4 GPUs, 160 sessions of 8
// turns re-sending 5,000–7,000 tokens), the sum with weight 1 and the
// blocks held as the load served 67.6% of prompt tokens from cache against
// 86.8%, 3,025 output tokens/s against 3,620, p90 TTFT 447 ms against
// 50 ms: a few running requests' worth of load outweighed a session's whole
// cached history and sent its turns away from their cache. Load is memory
// held, prefill is compute saved, and the budget already keeps a GPU from
// taking more than it holds. So a new session (cached nowhere) goes to the
// least loaded GPU and its next turns follow its cache while it fits
// there. The view decides only where a request goes, never whether it
// fits: what a GPU holds cached is free to evict, so it takes no room from
// the budget.
// Unless every GPU the request may go to can answer (its index whole),
// binding stays as without a view.

// Sharing by the backend's account. A GPU that shares counts a prompt
// block once for all the tickets that hold it (share.go), by the gateway's
// own names of the prompt's blocks, trusted to be what the backend shares.
// Where a view can see the GPU's cache, a block counts as shared only once
// the backend holds it: of a prompt's shareable blocks, the leading run
// the view says the GPU holds; the rest are the request's own, as on a GPU
// that does not share. So a name the backend does not share (another
// tokenization, a cache salt, prefix caching off on the backend) never
// lowers a charge, and a prompt another ticket was admitted with but the
// backend has not yet stored is counted again until it has: an over-count
// that lasts as long as that ticket. The fit and the admission that
// follows count the same run (shareRuns), though the view may change in
// between.

// CacheView says how much of a prompt a GPU's backends hold in their
// prefix cache, by their own account.
type CacheView interface {
	// Cached is how many of the leading blocks named prefix[0], prefix[1],
	// ... (as Group.Prefix names them) gpu holds; ok is false when it
	// cannot say now.
	Cached(gpu string, prefix []uint64) (n int, ok bool)
}

// SetCacheView makes binding weigh what each GPU holds cached (nil: not).
func (s *Scheduler) SetCacheView(v CacheView) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cacheView = v
}

// prefillBlocksLocked is how many of w's prompt blocks p must compute, by
// the view; ok is false when the view cannot say, or w names no blocks.
func (s *Scheduler) prefillBlocksLocked(p *gpu, w *waiter) (blocks int64, ok bool) {
	named := false
	for _, g := range w.shape {
		total := int64((g.Prompt + g.BlockTokens - 1) / g.BlockTokens)
		if len(g.Prefix) == 0 || g.Prompt <= 1 {
			blocks += total
			continue
		}
		named = true
		n, known := s.cacheView.Cached(p.name, g.Prefix[:min(len(g.Prefix), (g.Prompt-1)/g.BlockTokens)])
		if !known {
			return 0, false
		}
		blocks += total - int64(n)
	}
	return blocks, named
}

// cacheCostsLocked is, by GPU index, how many blocks w must prefill on
// each of its candidate GPUs; nil unless the view can say for every one.
// The slice is reused.
func (s *Scheduler) cacheCostsLocked(w *waiter) []int64 {
	if s.cacheView == nil || len(w.shape) == 0 {
		return nil
	}
	if len(s.costs) < len(s.gpus) {
		s.costs = make([]int64, len(s.gpus))
	}
	for _, r := range w.line.q.routes {
		if !eligible(w, r) {
			continue
		}
		pre, ok := s.prefillBlocksLocked(r.p, w)
		if !ok {
			return nil
		}
		s.costs[r.p.index] = pre
	}
	return s.costs
}

// shareRuns holds, for one candidate (of) and each GPU it was fitted on,
// how many of each of its groups' shareable blocks the GPU counted
// shared.
type shareRuns struct {
	of    *waiter
	valid []bool  // by GPU index
	runs  [][]int // by GPU index, then group
}

// shareRunsLocked is, for each group of w, how many of its shareable blocks
// p counts as held once: all of them where no view can see p's cache, else
// the leading run p holds cached. Asked again for the same w and p, it
// answers as the first time, until pickLocked looks at w afresh.
func (s *Scheduler) shareRunsLocked(p *gpu, w *waiter) []int {
	r := &s.runs
	if len(r.valid) < len(s.gpus) {
		r.valid, r.runs = make([]bool, len(s.gpus)), make([][]int, len(s.gpus))
	}
	if r.of != w {
		r.of = w
		clear(r.valid)
	}
	if r.valid[p.index] {
		return r.runs[p.index]
	}
	runs := r.runs[p.index][:0]
	for _, g := range w.shape {
		m := g.shareable()
		if m > 0 && s.cacheView != nil {
			if n, ok := s.cacheView.Cached(p.name, g.Prefix[:m]); ok {
				m = min(m, n)
			}
		}
		runs = append(runs, m)
	}
	r.runs[p.index], r.valid[p.index] = runs, true
	return runs
}
