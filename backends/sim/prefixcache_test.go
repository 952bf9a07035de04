package sim

import (
	"fmt"
	"testing"
	"time"
)

// ids is a prompt of n token ids, distinct per seed, as /tokenize would
// give it.
func ids(seed, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = int(mix(uint64(seed)<<32|uint64(i)) % plainVocab)
	}
	return out
}

// hreq is req for a prompt of known token ids, so that the prefix cache can
// hash it; salt "" means none.
func hreq(s *settings, prompt []int, salt string, out, n int) *request {
	r := req(len(prompt), out, n)
	var sb []byte
	if salt != "" {
		sb = []byte(salt)
	}
	b := newBlockHasher(s.blockSize, sb, 0)
	b.keep = s.kvEvents != nil
	for _, id := range prompt {
		b.add(id)
	}
	for i := range r.seqs {
		r.seqs[i].key = seqKey(uint64(len(prompt))^mix(uint64(prompt[0])), i)
	}
	r.cacheAs(&b, out)
	return r
}

// runToEnd steps e until every request in rs has ended.
func runToEnd(t *testing.T, e *engine, rs ...*request) {
	t.Helper()
	for steps := 0; ; steps++ {
		active := false
		for _, r := range rs {
			active = active || r.status.Load() == statusActive
		}
		if !active {
			return
		}
		if steps > 10000 {
			t.Fatal("no progress")
		}
		e.step()
		checkCache(t, e)
	}
}

// checkCache verifies the accounting invariant with the prefix cache: used
// is the anonymous blocks the running requests hold plus the distinct cache
// entries they reference; each entry's refs is the number of holders; the
// LRU list holds exactly the idle entries; the map names every live entry.
func checkCache(t *testing.T, e *engine) {
	t.Helper()
	c := e.cache
	holders := map[int32]int32{}
	var anon int64
	for _, r := range e.running {
		if r.shared != int64(r.prompt/e.s.blockSize) {
			t.Fatalf("request holds %d shared blocks, want %d", r.shared, r.prompt/e.s.blockSize)
		}
		anon += r.shared - int64(len(r.cached))
		for _, j := range r.cached {
			holders[j]++
		}
		for i := range r.seqs {
			sq := &r.seqs[i]
			anon += sq.own - int64(len(sq.cached))
			for _, j := range sq.cached {
				holders[j]++
			}
		}
	}
	for _, r := range e.waiting {
		if r.shared != 0 || len(r.cached) != 0 || r.seqs[0].own != 0 || len(r.seqs[0].cached) != 0 {
			t.Fatal("a waiting request holds blocks")
		}
	}
	if got := anon + int64(len(holders)); got != e.used {
		t.Fatalf("used = %d, but the running requests hold %d", e.used, got)
	}
	if e.used > e.s.numBlocks || e.used > e.peak {
		t.Fatalf("used %d, peak %d, pool %d", e.used, e.peak, e.s.numBlocks)
	}
	if c == nil {
		return
	}
	spare := map[int32]bool{}
	for _, j := range c.spare {
		spare[j] = true
	}
	live := 0
	for j := range c.blocks {
		if spare[int32(j)] {
			continue
		}
		live++
		b := &c.blocks[j]
		if b.refs != holders[int32(j)] {
			t.Fatalf("entry %d has refs %d, but %d running requests hold it", j, b.refs, holders[int32(j)])
		}
		if c.byHash[b.hash] != int32(j) {
			t.Fatalf("entry %d is not found by its hash", j)
		}
	}
	if live != len(c.byHash) || int64(live) > e.s.numBlocks {
		t.Fatalf("%d live entries, %d hashes, pool %d", live, len(c.byHash), e.s.numBlocks)
	}
	n := int64(0)
	for j, prev := c.head, noBlock; j != noBlock; prev, j = j, c.blocks[j].next {
		if c.blocks[j].refs != 0 || c.blocks[j].prev != prev {
			t.Fatalf("LRU entry %d has refs %d, prev %d (want %d)", j, c.blocks[j].refs, c.blocks[j].prev, prev)
		}
		n++
	}
	if n != c.idle || e.s.numBlocks-e.used < c.idle {
		t.Fatalf("LRU list of %d, idle %d, free %d", n, c.idle, e.s.numBlocks-e.used)
	}
}

// Only full blocks are shared, and never the last prompt token: a second
// request finds floor((len(common prefix) ∧ (prompt−1)) / BlockSize) blocks.
func TestPrefixCacheHitsFullBlocksButNotTheLastToken(t *testing.T) {
	tests := []struct {
		name          string
		first, second []int
		wantHit       int // tokens
	}{
		{"shorter than a block", ids(1, 15), ids(1, 15), 0},
		{"exactly one block: its last token is computed", ids(1, 16), ids(1, 16), 0},
		{"one block and a token", ids(1, 17), ids(1, 17), 16},
		{"exactly two blocks", ids(1, 32), ids(1, 32), 16},
		{"two blocks and a half", ids(1, 40), ids(1, 40), 32},
		{"longer than the first", ids(1, 40), ids(1, 80), 32},
		{"shorter than the first", ids(1, 80), ids(1, 40), 32},
		{"diverges inside the second block", ids(1, 40), append(ids(1, 20), ids(2, 20)...), 16},
		{"diverges in the first token", ids(1, 40), ids(2, 40), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := newTestEngine(t, poolConfig(64))
			a := hreq(e.s, tc.first, "", 1, 1)
			mustSubmit(t, e, a)
			runToEnd(t, e, a)
			b := hreq(e.s, tc.second, "", 1, 1)
			mustSubmit(t, e, b)
			e.step()
			checkCache(t, e)
			if got := e.cacheHits; got != int64(tc.wantHit) {
				t.Errorf("hit %d tokens, want %d", got, tc.wantHit)
			}
			if want := int64(len(tc.first) + len(tc.second)); e.cacheQueries != want {
				t.Errorf("queried %d tokens, want %d", e.cacheQueries, want)
			}
		})
	}
}

// Prefill skips the tokens found: the step that admits a request computes
// only what the cache does not hold.
func TestPrefixCacheShortensPrefill(t *testing.T) {
	c := poolConfig(64)
	c.StepBase, c.StepPerSeq, c.PrefillPerToken = 10*time.Millisecond, time.Millisecond, 100*time.Microsecond
	e, _ := newTestEngine(t, c)
	p := ids(3, 50)
	a := hreq(e.s, p, "", 1, 1)
	mustSubmit(t, e, a)
	if d, _ := e.step(); d != 11*time.Millisecond+50*100*time.Microsecond {
		t.Fatalf("first prefill step %v", d)
	}
	mustSubmit(t, e, hreq(e.s, p, "", 1, 1))
	// 48 of 50 tokens found: 2 computed.
	if d, _ := e.step(); d != 11*time.Millisecond+2*100*time.Microsecond {
		t.Fatalf("cached prefill step %v, want 11.2ms", d)
	}
}

// Two running requests with one prompt hold its full blocks once: the
// entries' reference counts, not the pool, count the second holder.
func TestPrefixCacheReferenceCounts(t *testing.T) {
	for _, tc := range []struct {
		n, m     int   // sequences of the first and second request
		wantUsed int64 // 2 shared prompt blocks, once, and one own block a sequence
	}{{1, 1, 4}, {3, 2, 7}} {
		t.Run(fmt.Sprintf("n=%d,%d", tc.n, tc.m), func(t *testing.T) {
			e, _ := newTestEngine(t, poolConfig(64))
			p := ids(4, 40)
			a, b := hreq(e.s, p, "", 5, tc.n), hreq(e.s, p, "", 8, tc.m)
			mustSubmit(t, e, a, b)
			e.step()
			checkCache(t, e)
			if e.used != tc.wantUsed {
				t.Fatalf("used %d, want %d", e.used, tc.wantUsed)
			}
			for _, j := range a.cached {
				if e.cache.blocks[j].refs != 2 {
					t.Fatalf("a prompt block has refs %d, want 2", e.cache.blocks[j].refs)
				}
			}
			runToEnd(t, e, a)
			for _, j := range b.cached {
				if e.cache.blocks[j].refs != 1 {
					t.Fatalf("after a ended a prompt block has refs %d, want 1", e.cache.blocks[j].refs)
				}
			}
			runToEnd(t, e, b)
			if e.used != 0 {
				t.Fatalf("used %d after both ended", e.used)
			}
		})
	}
}

// Usage counts the blocks running requests reference, not idle cached ones,
// which stay free: on /metrics, and for admission.
func TestPrefixCacheIdleBlocksAreFree(t *testing.T) {
	c := poolConfig(20)
	e, _ := newTestEngine(t, c)
	a := hreq(e.s, ids(5, 17*16), "", 1, 1) // 17 full blocks and one of 1 token: 18
	mustSubmit(t, e, a)
	runToEnd(t, e, a)
	st := e.stats()
	if st.UsedBlocks != 0 || st.CachedIdleBlocks != 17 {
		t.Fatalf("after the end: used %d, cached idle %d; want 0 and 17", st.UsedBlocks, st.CachedIdleBlocks)
	}
	// 19 blocks of another prompt fit the pool of 20 although 17 of it
	// hold a's prefix: 16 of those are evicted, the least recently freed
	// first, which vLLM makes the last blocks of a request.
	b := hreq(e.s, ids(6, 18*16), "", 2, 1)
	mustSubmit(t, e, b)
	e.step()
	checkCache(t, e)
	if b.state != stateRunning || e.used != 19 || e.cache.idle != 1 {
		t.Fatalf("b state %d, used %d, idle %d; want running, 19, 1", b.state, e.used, e.cache.idle)
	}
	if _, ok := e.cache.find(a.hashes[0]); !ok {
		t.Error("a's first block was evicted before its later ones")
	}
}

// Idle cached blocks are evicted least recently freed first, and a hit makes
// a block recent again.
func TestPrefixCacheEvictsLeastRecentlyUsed(t *testing.T) {
	e, _ := newTestEngine(t, poolConfig(20))
	pa, pb, pc := ids(7, 33), ids(8, 33), ids(9, 33) // 2 full blocks each
	for _, p := range [][]int{pa, pb, pc, pa} {      // a again: found, and freed last
		r := hreq(e.s, p, "", 1, 1)
		mustSubmit(t, e, r)
		runToEnd(t, e, r)
	}
	if e.cacheHits != 32 || e.cache.idle != 6 {
		t.Fatalf("hits %d, idle %d; want a's 32 tokens found and 6 idle blocks", e.cacheHits, e.cache.idle)
	}
	// 16 blocks with 14 anonymous ones free: the 2 oldest entries go (b's).
	d := hreq(e.s, ids(10, 15*16+1), "", 1, 1)
	mustSubmit(t, e, d)
	e.step()
	checkCache(t, e)
	a, b, c := hreq(e.s, pa, "", 1, 1), hreq(e.s, pb, "", 1, 1), hreq(e.s, pc, "", 1, 1)
	for _, tc := range []struct {
		name string
		r    *request
		kept bool
	}{{"a", a, true}, {"b", b, false}, {"c", c, true}} {
		for i, h := range tc.r.hashes {
			if _, ok := e.cache.find(h); ok != tc.kept {
				t.Errorf("%s's block %d cached = %t, want %t", tc.name, i, ok, tc.kept)
			}
		}
	}
}

// cache_salt isolates tenants: the same prompt with another salt, or none,
// finds nothing; with the same salt it finds its blocks.
func TestPrefixCacheSaltIsolates(t *testing.T) {
	tests := []struct {
		first, second string
		wantHit       int64
	}{{"", "", 32}, {"tenant-a", "tenant-a", 32}, {"tenant-a", "tenant-b", 0}, {"", "tenant-a", 0}, {"tenant-a", "", 0}}
	for _, tc := range tests {
		e, _ := newTestEngine(t, poolConfig(64))
		p := ids(11, 40)
		a := hreq(e.s, p, tc.first, 1, 1)
		mustSubmit(t, e, a)
		runToEnd(t, e, a)
		mustSubmit(t, e, hreq(e.s, p, tc.second, 1, 1))
		e.step()
		if e.cacheHits != tc.wantHit {
			t.Errorf("salts %q then %q: hit %d tokens, want %d", tc.first, tc.second, e.cacheHits, tc.wantHit)
		}
	}
}

// Output blocks that fill are cached: a prompt that is an earlier request's
// prompt and output finds both.
func TestPrefixCacheCachesOutputBlocks(t *testing.T) {
	e, _ := newTestEngine(t, poolConfig(64))
	p := ids(12, 20)
	a := hreq(e.s, p, "", 30, 1) // 50 tokens: 3 full blocks, the last two partly output
	mustSubmit(t, e, a)
	runToEnd(t, e, a)
	next := append([]int(nil), p...)
	for t := range 30 {
		next = append(next, outputTokenID(a.seqs[0].key, t))
	}
	next = append(next, tokEOT, tokStartHdr)
	mustSubmit(t, e, hreq(e.s, next, "", 1, 1))
	e.step()
	if e.cacheHits != 48 {
		t.Fatalf("the next turn found %d tokens, want 48", e.cacheHits)
	}
}

// Preempting a request frees its references; its full blocks stay cached,
// and when it is admitted again its recomputation finds what was not
// evicted meanwhile.
func TestPrefixCachePreemptionFreesReferences(t *testing.T) {
	c := poolConfig(10)
	c.MaxModelLen = 96
	c.PrefillPerToken = time.Millisecond
	e, _ := newTestEngine(t, c)
	a, b := hreq(e.s, ids(13, 20), "", 76, 1), hreq(e.s, ids(14, 20), "", 76, 1)
	mustSubmit(t, e, a)
	e.step()
	mustSubmit(t, e, b)
	var readmit, full time.Duration
	for steps := 0; a.status.Load() == statusActive || b.status.Load() == statusActive; steps++ {
		if steps > 1000 {
			t.Fatal("no progress")
		}
		gen := b.seqs[0].gen
		wasWaiting := b.state == stateWaiting && gen > 0
		d, ok := e.step()
		if !ok {
			t.Fatal("engine idle with work left")
		}
		checkCache(t, e)
		if wasWaiting && b.state != stateWaiting && readmit == 0 {
			readmit = d
			// Every running sequence's share, and b's prompt and output
			// computed again in full.
			full = e.s.pace.stepBase + time.Duration(e.runningSeqs)*e.s.pace.stepPerSeq + time.Duration(20+gen)*time.Millisecond
		}
	}
	if e.preemptions == 0 || readmit == 0 {
		t.Fatalf("preemptions %d, readmission step %v; want b preempted and readmitted", e.preemptions, readmit)
	}
	// Recomputing b finds at least its prompt's full block.
	if readmit > full-16*time.Millisecond {
		t.Errorf("readmission step %v, the full recomputation %v: less than a block found", readmit, full)
	}
	if e.used != 0 || e.genTokens != 152 {
		t.Fatalf("used %d, generated %d at the end", e.used, e.genTokens)
	}
}

// transcript runs a fixed workload, stepping by hand, and records every
// step's duration and usage.
func transcript(t *testing.T, c Config, hashed bool) []string {
	t.Helper()
	e, _ := newTestEngine(t, c)
	mk := func(p []int, out, n int) *request {
		if hashed {
			return hreq(e.s, p, "", out, n)
		}
		return req(len(p), out, n)
	}
	sys := ids(20, 48)
	var rs []*request
	for i := range 6 {
		p := append(append([]int(nil), sys...), ids(21+i, 10+7*i)...)
		rs = append(rs, mk(p, 20+5*i, 1+i%2), mk(p, 7, 1))
	}
	var out []string
	for i, r := range rs {
		mustSubmit(t, e, r)
		if i%3 == 2 {
			d, _ := e.step()
			out = append(out, fmt.Sprint(d, e.used, e.peak, e.preemptions, len(e.waiting)))
		}
	}
	for steps := 0; ; steps++ {
		d, ok := e.step()
		if !ok {
			break
		}
		checkCache(t, e)
		out = append(out, fmt.Sprint(d, e.used, e.peak, e.preemptions, len(e.waiting)))
	}
	return out
}

// With the cache off the engine is the one before the cache: hashed
// requests run exactly as unhashed ones. With it on, the run is still a
// function of the workload alone, and it differs.
func TestPrefixCacheOffIsUnchangedAndOnIsDeterministic(t *testing.T) {
	c := poolConfig(24)
	c.StepBase, c.StepPerSeq, c.PrefillPerToken = 10*time.Millisecond, time.Millisecond, 100*time.Microsecond
	plain := transcript(t, c, false)
	off := c
	off.DisablePrefixCaching = true
	if got := transcript(t, off, true); fmt.Sprint(got) != fmt.Sprint(plain) {
		t.Fatalf("cache off changed the run:\n got %v\nwant %v", got, plain)
	}
	on1, on2 := transcript(t, c, true), transcript(t, c, true)
	if fmt.Sprint(on1) != fmt.Sprint(on2) {
		t.Fatalf("two runs with the cache differ:\n%v\n%v", on1, on2)
	}
	if fmt.Sprint(on1) == fmt.Sprint(plain) {
		t.Fatal("the cache changed nothing in a workload with a shared system prompt")
	}
}

// In oom mode, running out of blocks is still an out-of-memory event with
// the cache on: idle cached blocks are free, referenced ones are not.
func TestPrefixCacheOOMWhenReferencedBlocksFillThePool(t *testing.T) {
	c := poolConfig(20)
	c.OnOverflow = OverflowOOM
	e, _ := newTestEngine(t, c)
	// Three different prompts of 8 blocks at their largest: 24 > 20.
	rs := []*request{hreq(e.s, ids(30, 100), "", 28, 1), hreq(e.s, ids(31, 100), "", 28, 1), hreq(e.s, ids(32, 100), "", 28, 1)}
	mustSubmit(t, e, rs...)
	for i := 0; e.oomEvents == 0; i++ {
		if i > 100 {
			t.Fatal("no OOM")
		}
		e.step()
		checkCache(t, e)
	}
	if e.used != 0 || e.cache.idle == 0 {
		t.Fatalf("after OOM: used %d, idle cached %d; want 0 and the prompts still cached", e.used, e.cache.idle)
	}
	// The same three prompts again share nothing with each other but fit
	// two at a time; one prompt thrice shares its blocks and fits.
	e2, _ := newTestEngine(t, c)
	p := ids(33, 100)
	rs = []*request{hreq(e2.s, p, "", 28, 1), hreq(e2.s, p, "", 28, 1), hreq(e2.s, p, "", 28, 1)}
	mustSubmit(t, e2, rs...)
	runToEnd(t, e2, rs...)
	if e2.oomEvents != 0 {
		t.Fatal("three requests sharing a 6-block prompt ran out of 20 blocks")
	}
}

// The ids the cache hashes generated blocks by are the ids the tokenizer
// gives the generated text, alone and after any prompt: what makes a next
// turn's prompt tokens equal to its history's.
func TestOutputTokensTokenizeBackToThemselves(t *testing.T) {
	tokenize := func(text string) []int {
		p := newPrompt(true, false)
		p.text([]byte(text))
		return p.ids
	}
	for _, prompt := range []string{"", "word", "word ", "a   ", "a    ", "123", "x,", "line\n", "\r", "café", " 😀", "tab\t", "end."} {
		for k := range uint64(20) {
			key := mix(k)
			text := string(appendText(nil, key, 0, 100))
			want := tokenize(prompt)
			for i := range 100 {
				want = append(want, outputTokenID(key, i))
			}
			if got := tokenize(prompt + text); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("prompt %q + output of key %d: tokens differ from the prompt's and the output's", prompt, k)
			}
		}
	}
}

// A randomized workload, prefixes shared or not, n > 1, aborts, in both
// overflow modes: the accounting invariant holds after every step, and the
// pool is empty at the end.
func TestPrefixCacheRandomizedInvariant(t *testing.T) {
	for _, mode := range []string{OverflowPreempt, OverflowOOM} {
		var overflows int64
		for seed := range uint64(8) {
			c := poolConfig(40)
			c.OnOverflow = mode
			c.OOMRestart = -1
			e, _ := newTestEngine(t, c)
			rnd := seed * 0x9e3779b97f4a7c15
			next := func(n uint64) int { rnd = mix(rnd); return int(rnd % n) }
			prefixes := [][]int{ids(40, 64), ids(41, 16), ids(42, 33)}
			var live []*request
			for step := range 400 {
				if next(3) == 0 {
					p := append(append([]int(nil), prefixes[next(3)]...), ids(100+step, next(40))...)
					r := hreq(e.s, p, []string{"", "x"}[next(2)], 1+next(60), 1+next(3))
					if e.submit(r) == nil {
						live = append(live, r)
					}
				}
				if len(live) > 0 && next(25) == 0 {
					e.abort(live[next(uint64(len(live)))])
				}
				e.step()
				checkCache(t, e)
			}
			for _, r := range live {
				e.abort(r)
			}
			checkCache(t, e)
			if e.used != 0 {
				t.Fatalf("%s seed %d: %d blocks used with nothing running", mode, seed, e.used)
			}
			if mode == OverflowPreempt && e.cacheHits == 0 {
				t.Errorf("seed %d: a workload of shared prefixes found nothing", seed)
			}
			overflows += e.preemptions + e.oomEvents
		}
		if overflows == 0 {
			t.Errorf("%s: the workload never overflowed the pool", mode)
		}
	}
}
