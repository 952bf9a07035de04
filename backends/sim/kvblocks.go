package sim

// The blocks running requests hold: what a request is given when it is
// admitted (the prefix cache's blocks first, then new ones), when its
// sequences grow, and what it gives back. The engine's methods here run
// under engine.mu (see the accounting invariant on engine); cacheAs runs
// before the request is submitted, while its handler owns it.

// cacheAs makes r cacheable with the block hashes of its prompt, and sizes
// its block lists for a request that runs to maxTokens (up to a bound, as n
// long sequences would take much for what most will not fill), so that the
// step path seldom allocates.
func (r *request) cacheAs(b *blockHasher, maxTokens int) {
	r.cacheable, r.hashes, r.tailState, r.promptIDs = true, b.hashes, b.state, b.ids
	r.cached = make([]int32, 0, len(b.hashes))
	own := min((r.prompt+maxTokens)/b.size-len(b.hashes), 64)
	for i := range r.seqs {
		sq := &r.seqs[i]
		sq.hstate = r.tailState
		sq.hashes = make([]uint64, 0, own)
		sq.cached = make([]int32, 0, own)
	}
}

// freeLocked returns every block r holds to the pool. vLLM frees a
// request's blocks last first, so that its prefix, the part most likely to
// be asked for again, is evicted last: what each sequence generated goes
// before the prompt.
func (e *engine) freeLocked(r *request) {
	for i := range r.seqs {
		sq := &r.seqs[i]
		e.releaseLocked(sq.own, sq.cached)
		sq.own, sq.cached = 0, sq.cached[:0]
	}
	e.releaseLocked(r.shared, r.cached)
	r.shared, r.cached = 0, r.cached[:0]
}

// releaseLocked drops n held blocks, of which cached are cache entries (in
// block order): anonymous ones are free at once, entries when no other
// running request holds them.
func (e *engine) releaseLocked(n int64, cached []int32) {
	e.used -= n - int64(len(cached))
	for i := len(cached) - 1; i >= 0; i-- {
		if e.cache.unref(cached[i]) {
			e.used--
		}
	}
}

// allocLocked takes n new blocks from the pool, which has them: anonymous
// free blocks first (recent vLLM puts blocks without a hash at the front of
// its free queue), then idle cache entries, least recently freed first.
func (e *engine) allocLocked(n int64) {
	if e.cache != nil {
		if short := n - (e.s.numBlocks - e.used - e.cache.idle); short > 0 {
			e.cache.evict(short)
		}
	}
	e.used += n
	e.notePeakLocked()
}

// refLocked makes r hold cache entry i, which a lookup found.
func (e *engine) refLocked(i int32) {
	if e.cache.ref(i) {
		e.used++
		e.notePeakLocked()
	}
}

func (e *engine) notePeakLocked() {
	if e.used > e.peak {
		e.peak = e.used
	}
}

// span is the tokens whose blocks a sequence that has generated gen tokens
// holds through the next step: the prompt, what it generated, and the slot
// of the token the step computes. A pooling request's one step computes its
// prompt and nothing after it, as vLLM allocates for a pooling model.
func (r *request) span(gen int) int {
	if r.pooling {
		return r.prompt
	}
	return r.prompt + gen + 1
}

// growthLocked is the blocks r's live sequences need beyond what they hold to
// each have one more token.
func (e *engine) growthLocked(r *request) int64 {
	var need int64
	for i := range r.seqs {
		sq := &r.seqs[i]
		if sq.gen < sq.target {
			need += e.blocks(r.span(sq.gen)) - r.shared - sq.own
		}
	}
	return need
}

func (e *engine) growLocked(r *request) {
	for i := range r.seqs {
		sq := &r.seqs[i]
		if sq.gen < sq.target {
			want := e.blocks(r.span(sq.gen)) - r.shared
			e.allocLocked(want - sq.own)
			sq.own = want
		}
	}
}

// lookupLocked plans r's admission: which blocks the prefix cache has for it
// (into hitBuf and seqHits, for admitLocked; hits of them are the prompt's
// full blocks), how many blocks it takes from the free pool (idle entries it
// hits leave the pool too) and how many tokens it computes: its prompt and,
// recomputing after a preemption, what it generated, less what the cache
// holds. Without the cache, or for a request it cannot hold, nothing hits.
func (e *engine) lookupLocked(r *request) (need int64, compute, hits int) {
	bs := e.s.blockSize
	shared := r.prompt / bs
	e.hitBuf, e.seqHits = e.hitBuf[:0], e.seqHits[:0]
	compute = r.prompt
	var want int64
	for i := range r.seqs {
		sq := &r.seqs[i]
		compute += sq.gen // recomputed
		e.seqHits = append(e.seqHits, 0)
		if sq.gen < sq.target {
			want += e.blocks(r.span(sq.gen)) - int64(shared)
		}
	}
	need = int64(shared) + want
	if e.cache == nil || !r.cacheable {
		return need, compute, 0
	}
	// vLLM never takes a sequence's last token from the cache: computing it
	// is what gives the logits of the next one. So a prompt of exactly N
	// full blocks hits at most N−1 of them.
	last := r.prompt - 1
	for i := range r.seqs {
		if sq := &r.seqs[i]; sq.gen < sq.target {
			last = max(last, r.prompt+sq.gen-1)
		}
	}
	var idle int64
	for _, h := range r.hashes[:min(shared, last/bs)] {
		j, ok := e.cache.find(h)
		if !ok {
			break // hashes are chained: nothing after a miss can match
		}
		e.hitBuf = append(e.hitBuf, j)
		if e.cache.blocks[j].refs == 0 {
			idle++
		}
	}
	hits = len(e.hitBuf)
	need -= int64(hits)
	compute -= hits * bs
	if hits < shared {
		return need + idle, compute, hits
	}
	// A preempted request's sequences may find the blocks they had filled.
	// Their first own block holds the prompt's tail too, which is computed
	// once for all of them: it is a hit only if every one finds its block.
	tail, tailHit := r.prompt-shared*bs, true
	for i := range r.seqs {
		sq := &r.seqs[i]
		if sq.gen >= sq.target {
			continue
		}
		k := 0
		for _, h := range sq.hashes[:min(len(sq.hashes), max(0, (r.prompt+sq.gen-1)/bs-shared))] {
			j, ok := e.cache.find(h)
			if !ok {
				break
			}
			e.hitBuf = append(e.hitBuf, j)
			if e.cache.blocks[j].refs == 0 {
				idle++
			}
			k++
		}
		e.seqHits[i] = k
		need -= int64(k)
		if k == 0 {
			tailHit = false
		} else {
			compute -= k*bs - tail
		}
	}
	if tailHit {
		compute -= tail
	}
	// An idle entry hit by two sequences is counted twice: need errs on
	// the safe side, by a block, in a case as rare as equal outputs.
	return need + idle, compute, hits
}

// admitLocked gives r the blocks lookupLocked planned: the entries it found,
// then new blocks for the rest, hashing its full prompt blocks and its
// sequences' full blocks into the cache so that requests after it (in the
// same step too, as vLLM caches blocks when it allocates them) find them.
func (e *engine) admitLocked(r *request, hits int) {
	shared := r.prompt / e.s.blockSize
	caching := e.cache != nil && r.cacheable
	// Referenced first, so that allocations below cannot evict them.
	for _, j := range e.hitBuf {
		e.refLocked(j)
	}
	r.cached = append(r.cached, e.hitBuf[:hits]...)
	e.allocLocked(int64(shared - hits))
	if caching {
		for k, h := range r.hashes[hits:] {
			if j, ok := e.cache.insert(h); ok {
				r.cached = append(r.cached, j)
				if e.events != nil {
					e.storedLocked(r, nil, hits+k, h)
				}
			}
		}
	}
	r.shared = int64(shared)
	off := hits
	for i := range r.seqs {
		sq := &r.seqs[i]
		if sq.gen >= sq.target {
			continue
		}
		k := e.seqHits[i]
		sq.cached = append(sq.cached, e.hitBuf[off:off+k]...)
		off += k
		want := e.blocks(r.span(sq.gen)) - int64(shared)
		e.allocLocked(want - int64(k))
		if caching {
			for k2, h := range sq.hashes[k:] {
				if j, ok := e.cache.insert(h); ok {
					sq.cached = append(sq.cached, j)
					if e.events != nil {
						e.storedLocked(r, sq, shared+k+k2, h)
					}
				}
			}
		}
		sq.own = want
	}
}

// fillLocked hashes sq's newest token into the block it fills and, when
// that block is full, caches it: so a conversation's next turn, whose prompt
// is this one's prompt and output, finds it.
func (e *engine) fillLocked(r *request, sq *sequence) {
	sq.hstate = absorb(sq.hstate, outputTokenID(sq.key, sq.gen-1))
	if (r.prompt+sq.gen)%e.s.blockSize != 0 {
		return
	}
	h := sq.hstate
	sq.hashes = append(sq.hashes, h)
	sq.hstate = chainStart(h)
	if j, ok := e.cache.insert(h); ok {
		sq.cached = append(sq.cached, j)
		if e.events != nil {
			e.storedLocked(r, sq, r.prompt/e.s.blockSize+len(sq.hashes)-1, h)
		}
	}
}
