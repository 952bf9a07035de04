package gateway

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// tokenCache remembers the backend's /tokenize answers, so that a prompt
// seen before is counted without a round trip: chat clients resend the
// same system prompt and history on every turn, and benchmarks and agents
// repeat whole prompts.
//
// Key. A 128-bit hash of what the backend's count depends on: the
// endpoint, the model and the prompt as the client wrote it (messages and
// tools, or the prompt), its bytes taken from the body as they are, so a
// hit builds no /tokenize body and parses nothing more (promptTexts). Two
// requests that differ only in their JSON's spacing or escapes are two
// entries, each exact. Two seeded maphash functions make collisions
// astronomically unlikely, and, being seeded at random per process, keep a
// client from crafting a prompt whose hash collides with another's count.
//
// Accuracy. A hit returns the count the backend gave for the identical body
// earlier, so it is as exact as asking again while the backend's tokenizer
// and chat template stay the same. If they change under the same model
// name (a redeployed backend), entries go stale: the usage the backend
// reports with each answer catches that, and an entry it contradicts is
// dropped (counted in stale), so the next request asks the backend again.
// Misses cost what no cache costs: one /tokenize round trip.
//
// Chains. Where a GPU of the model shares prompt blocks (prefix.go), an
// entry also keeps the prompt's chain, the names of its full blocks, so
// that a prompt seen before is shared without a round trip: 8 bytes a
// block, at most 64 × capacity names in all, the least recently used
// entries' chains dropped first (such an entry is asked again when its
// chain is wanted).
//
// Bound. At most capacity entries, least recently used evicted first; an
// entry is a few dozen bytes whatever the prompt's length, and its chain. Entries live in
// a slice (grown as entries come, up to capacity) threaded by a doubly
// linked list of indices, so a full cache allocates nothing.
type tokenCache struct {
	seeds    [2]maphash.Seed
	capacity int

	hits, misses, stale atomic.Int64

	mu    sync.Mutex // guards index, slots, head and tail
	index map[tokenKey]int32
	slots []tokenSlot
	names int // Σ len(chain) over the slots, at most maxNames
	// maxNames bounds names: 64 per entry.
	maxNames int
	head     int32 // most recently used; -1 when empty
	tail     int32 // least recently used; -1 when empty
}

type tokenKey [2]uint64

type tokenSlot struct {
	key        tokenKey
	count      int
	chain      []uint64 // never written once stored: readers keep it
	prev, next int32    // neighbours in recency order; -1 at the ends
}

func newTokenCache(capacity int) *tokenCache {
	return &tokenCache{
		seeds:    [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		capacity: capacity,
		maxNames: 64 * max(capacity, 0),
		index:    map[tokenKey]int32{},
		head:     -1, tail: -1,
	}
}

// key is the key of prompt i of r.
func (c *tokenCache) key(r *request, i int) tokenKey {
	var k tokenKey
	for j := range k {
		var h maphash.Hash
		h.SetSeed(c.seeds[j])
		pt := r.prompts[i]
		h.WriteByte(byte(r.kind))
		writeLenPrefixed(&h, []byte(r.model))
		writeLenPrefixed(&h, pt.text)
		if pt.tools != nil {
			writeLenPrefixed(&h, pt.tools)
		}
		k[j] = h.Sum64()
	}
	return k
}

// writeLenPrefixed writes b after its length, so that no two sequences of
// parts hash the same bytes.
func writeLenPrefixed(h *maphash.Hash, b []byte) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// get returns the count cached under k and marks it recently used.
func (c *tokenCache) get(k tokenKey) (int, bool) {
	n, _, ok := c.lookup(k, 0)
	return n, ok
}

// lookup returns the count and the chain (nil if none is kept) cached
// under k and marks it recently used. When the caller is after the chain
// (blockSize > 0), an entry without one is a miss unless its prompt has
// no block to share (its last token's block is never shared).
func (c *tokenCache) lookup(k tokenKey, blockSize int) (int, []uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.index[k]
	if !ok || blockSize > 0 && c.slots[i].chain == nil && (c.slots[i].count-1)/blockSize > 0 {
		c.misses.Add(1)
		return 0, nil, false
	}
	c.hits.Add(1)
	c.moveToFrontLocked(i)
	return c.slots[i].count, c.slots[i].chain, true
}

// put caches count under k, evicting the least recently used entry when
// full.
func (c *tokenCache) put(k tokenKey, count int) { c.putChain(k, count, nil) }

// putChain caches count and, when not nil, chain under k. An entry whose
// count changes loses a chain it had.
func (c *tokenCache) putChain(k tokenKey, count int, chain []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.index[k]
	switch {
	case ok:
		c.moveToFrontLocked(i)
	case len(c.slots) < c.capacity:
		i = int32(len(c.slots))
		c.slots = append(c.slots, tokenSlot{prev: -1, next: -1})
		c.index[k] = i
		c.pushFrontLocked(i)
	default:
		i = c.tail
		c.unlinkLocked(i)
		delete(c.index, c.slots[i].key)
		c.setChainLocked(i, nil)
		c.index[k] = i
		c.pushFrontLocked(i)
	}
	sl := &c.slots[i]
	if ok && sl.count != count || chain != nil {
		c.setChainLocked(i, nil)
	}
	sl.key, sl.count = k, count
	if chain != nil && len(chain) <= c.maxNames {
		// Room for it: the least recently used chains go first.
		for j := c.tail; c.names+len(chain) > c.maxNames && j != -1; j = c.slots[j].prev {
			c.setChainLocked(j, nil)
		}
		c.setChainLocked(i, chain)
	}
}

// setChainLocked sets slot i's chain, keeping the count of names.
func (c *tokenCache) setChainLocked(i int32, chain []uint64) {
	c.names += len(chain) - len(c.slots[i].chain)
	c.slots[i].chain = chain
}

// forget drops the entry under k if it still holds count: the backend's
// usage said the prompt has another length.
func (c *tokenCache) forget(k tokenKey, count int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.index[k]
	if !ok || c.slots[i].count != count {
		return
	}
	c.stale.Add(1)
	c.unlinkLocked(i)
	delete(c.index, k)
	c.setChainLocked(i, nil)
	// Move the last slot into the hole, so that slots stay dense.
	last := int32(len(c.slots) - 1)
	if i != last {
		c.slots[i] = c.slots[last]
		c.index[c.slots[i].key] = i
		c.relinkLocked(last, i)
	}
	c.slots = c.slots[:last]
}

// len is the number of entries.
func (c *tokenCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.slots)
}

func (c *tokenCache) moveToFrontLocked(i int32) {
	if c.head == i {
		return
	}
	c.unlinkLocked(i)
	c.pushFrontLocked(i)
}

func (c *tokenCache) pushFrontLocked(i int32) {
	s := &c.slots[i]
	s.prev, s.next = -1, c.head
	if c.head >= 0 {
		c.slots[c.head].prev = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
}

func (c *tokenCache) unlinkLocked(i int32) {
	s := &c.slots[i]
	if s.prev >= 0 {
		c.slots[s.prev].next = s.next
	} else {
		c.head = s.next
	}
	if s.next >= 0 {
		c.slots[s.next].prev = s.prev
	} else {
		c.tail = s.prev
	}
	s.prev, s.next = -1, -1
}

// relinkLocked points the neighbours (and head or tail) of the slot that
// moved from index from to index to.
func (c *tokenCache) relinkLocked(from, to int32) {
	s := &c.slots[to]
	if s.prev >= 0 {
		c.slots[s.prev].next = to
	} else if c.head == from {
		c.head = to
	}
	if s.next >= 0 {
		c.slots[s.next].prev = to
	} else if c.tail == from {
		c.tail = to
	}
}
