package sim

// vLLM's automatic prefix caching, as its V1 block pool does it (see doc.go,
// Memory). Only blocks that have a hash have an identity here: every other
// block of the pool is interchangeable and counted, not named, because
// nothing can ever find it again.
//
// A block's hash is chained: it covers its parent block's hash and its own
// token ids, so equal hashes mean equal prefixes up to the end of the block.
// The chain starts from a root that the request's cache_salt changes, which
// is how vLLM keeps tenants from reading each other's cache (vLLM puts the
// salt in the first block's extra keys; a salted root is the same thing).
// Hashes are 64-bit mixes, not vLLM's SHA-256: a collision is as unlikely as
// the simulator needs.

// Constants that keep the hashes of roots, chains and salts apart.
const (
	saltRoot  uint64 = 0x726f6f74 // "root"
	saltChain uint64 = 0x636861696e
	saltCache uint64 = 0x73616c74 // "salt"
)

// rootHash is the parent of a prompt's first block: one value for requests
// without a cache_salt, another for each salt.
func rootHash(salt []byte) uint64 {
	if salt == nil {
		return mix(saltRoot)
	}
	h := uint64(14695981039346656037)
	for _, c := range salt {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return mix(h ^ saltCache)
}

// chainStart is the hash state of a block whose parent hashed to parent,
// before any of its tokens.
func chainStart(parent uint64) uint64 { return mix(parent ^ saltChain) }

// absorb adds one token id to a block's hash state; after BlockSize tokens
// the state is the block's hash.
func absorb(state uint64, id int) uint64 { return mix(state ^ uint64(id)) }

// blockHasher hashes a token stream into the chained hashes of its full
// blocks. state is what the tokens after the last full block come to, which
// the sequences that continue the stream start from. The zero value is off:
// size 0 hashes nothing.
type blockHasher struct {
	size   int
	n      int // tokens absorbed since the last full block
	state  uint64
	hashes []uint64
	// ids is every token id added, when keep is set: what the KV events
	// of the blocks carry.
	keep bool
	ids  []uint32
}

// newBlockHasher hashes into blocks of size tokens; blocksHint is a guess of
// how many full blocks there will be, to allocate their hashes once.
func newBlockHasher(size int, salt []byte, blocksHint int) blockHasher {
	return blockHasher{size: size, state: chainStart(rootHash(salt)), hashes: make([]uint64, 0, blocksHint)}
}

func (b *blockHasher) on() bool { return b.size > 0 }

func (b *blockHasher) add(id int) {
	if b.keep {
		b.ids = append(b.ids, uint32(id))
	}
	b.state = absorb(b.state, id)
	if b.n++; b.n == b.size {
		b.hashes = append(b.hashes, b.state)
		b.state = chainStart(b.state)
		b.n = 0
	}
}

// noBlock ends the LRU list.
const noBlock int32 = -1

// cachedBlock is a block of the pool that holds a hashed, full block of KV.
// refs counts the running requests that hold it; at zero it is idle: free
// for any allocation, and on the LRU list until one evicts it.
type cachedBlock struct {
	hash       uint64
	refs       int32
	prev, next int32 // LRU links while idle
}

// prefixCache is the hash table and LRU list of a pool's hashed blocks; the
// engine keeps the pool's counts (engine.used) and calls it under its mutex.
//
// Invariants: byHash[b.hash] is b's index for every live entry; an entry is
// on the LRU list exactly when refs is 0; idle is the list's length; live
// entries number at most the pool's blocks.
type prefixCache struct {
	blocks     []cachedBlock // entries; those in spare are unused
	spare      []int32
	byHash     map[uint64]int32
	head, tail int32 // LRU: head is the least recently freed, evicted first
	idle       int64
	// onEvict, if set, hears of each block forgotten (KV events).
	onEvict func(h uint64)
}

func newPrefixCache() *prefixCache {
	return &prefixCache{byHash: make(map[uint64]int32), head: noBlock, tail: noBlock}
}

// find is the entry holding hash h, if any.
func (c *prefixCache) find(h uint64) (int32, bool) {
	i, ok := c.byHash[h]
	return i, ok
}

// insert names a block just filled by a running request (refs 1). When a
// block with the same hash exists already, the new one stays anonymous, as
// a duplicate nothing will look up (vLLM keeps duplicates findable; one copy
// is enough for every hit the simulator counts).
func (c *prefixCache) insert(h uint64) (int32, bool) {
	if _, ok := c.byHash[h]; ok {
		return noBlock, false
	}
	var i int32
	if n := len(c.spare); n > 0 {
		i = c.spare[n-1]
		c.spare = c.spare[:n-1]
	} else {
		i = int32(len(c.blocks))
		c.blocks = append(c.blocks, cachedBlock{})
	}
	c.blocks[i] = cachedBlock{hash: h, refs: 1, prev: noBlock, next: noBlock}
	c.byHash[h] = i
	return i, true
}

// ref takes one more reference to entry i; it reports whether the block was
// idle, i.e. whether the pool's used count grows.
func (c *prefixCache) ref(i int32) bool {
	b := &c.blocks[i]
	b.refs++
	if b.refs > 1 {
		return false
	}
	c.unlink(i)
	return true
}

// unref drops one reference to entry i; it reports whether the block became
// idle. An idle block joins the LRU list at its tail, so the blocks freed
// most recently are evicted last.
func (c *prefixCache) unref(i int32) bool {
	b := &c.blocks[i]
	b.refs--
	if b.refs > 0 {
		return false
	}
	b.prev, b.next = c.tail, noBlock
	if c.tail != noBlock {
		c.blocks[c.tail].next = i
	} else {
		c.head = i
	}
	c.tail = i
	c.idle++
	return true
}

func (c *prefixCache) unlink(i int32) {
	b := &c.blocks[i]
	if b.prev != noBlock {
		c.blocks[b.prev].next = b.next
	} else {
		c.head = b.next
	}
	if b.next != noBlock {
		c.blocks[b.next].prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.prev, b.next = noBlock, noBlock
	c.idle--
}

// evict forgets the n least recently freed idle blocks (n <= idle), so that
// an allocation can reuse them.
func (c *prefixCache) evict(n int64) {
	for ; n > 0; n-- {
		i := c.head
		h := c.blocks[i].hash
		c.unlink(i)
		delete(c.byHash, h)
		if c.onEvict != nil {
			c.onEvict(h)
		}
		c.blocks[i] = cachedBlock{}
		c.spare = append(c.spare, i)
	}
}
