package kvevents

import (
	"strings"
	"sync"
)

// Chain names blocks by content as the gateway names a prompt's blocks:
// Step(parent, ids) is the name of a block of token ids whose previous
// block is named parent, and Root stands for the parent of a sequence's
// first block. Equal names mean equal prefixes up to the block's end.
type Chain struct {
	Root uint64
	Step func(parent uint64, ids []uint32) uint64
}

// orphanRoot is the parent name of blocks the index cannot chain to the
// base model's root: stored under a parent it never saw, or for a LoRA
// adapter. They are held, so counted, but no prompt's name can match them.
const orphanRoot uint64 = 0x6f727068616e // "orphan"

// Index is what one publisher's GPU cache holds, by the gateway's names.
// It is built from the publisher's events alone, so it sees what the
// gateway's own table cannot: blocks kept cached after their requests
// ended, blocks other clients put there, and evictions.
//
// Invariants: byHash maps every block the publisher stored and has not
// removed since the last reset to its name; names[n] is how many of them
// are named n (the publisher may hold one content twice). Applying a
// batch never makes the index claim a block the publisher does not hold,
// provided no message was lost since the last reset; a lost message
// resets it (Reset), after which it holds a subset of the truth: blocks
// stored before the loss and still held are missing until they are
// stored again. whole says the index is complete as well as correct.
type Index struct {
	chain Chain

	mu     sync.RWMutex
	byHash map[Hash]uint64
	names  map[uint64]int32
	// whole is false from a reset for a lost message until the publisher
	// clears its cache or has stored capacity blocks since (by then LRU
	// eviction has had to make room for as many blocks as it holds, so
	// what is missing is at most what was hit in between: a block held
	// but not claimed costs a missed saving, never an overflow).
	whole    bool
	since    int64 // blocks stored since the last reset
	capacity int64 // the GPU's blocks; 0 = unknown
}

// NewIndex is an empty index that names blocks by c. It is not whole
// until its subscriber knows it has seen the publisher from its start.
func NewIndex(c Chain) *Index {
	return &Index{chain: c, byHash: map[Hash]uint64{}, names: map[uint64]int32{}}
}

// SetCapacity tells the index how many blocks the GPU's cache has (the
// backend's num_gpu_blocks), the horizon after which a reset index is
// whole again; 0 means unknown, and then only a cleared cache or a
// publisher's restart makes it whole.
func (x *Index) SetCapacity(blocks int64) {
	x.mu.Lock()
	x.capacity = blocks
	x.checkWholeLocked()
	x.mu.Unlock()
}

// Reset forgets every block. whole says the publisher's cache is known
// to be empty too (it restarted, from its first message); otherwise what
// it holds now is unknown.
func (x *Index) Reset(whole bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	clear(x.byHash)
	clear(x.names)
	x.whole, x.since = whole, 0
}

// Apply enters a batch's events.
func (x *Index) Apply(b Batch) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := range b.Events {
		x.applyLocked(&b.Events[i])
	}
	x.checkWholeLocked()
}

func onGPU(medium string) bool { return medium == "" || strings.EqualFold(medium, "GPU") }

func (x *Index) applyLocked(e *Event) {
	switch e.Kind {
	case AllBlocksCleared:
		clear(x.byHash)
		clear(x.names)
		x.whole, x.since = true, 0
	case BlockRemoved:
		if !onGPU(e.Medium) {
			return
		}
		for _, h := range e.Hashes {
			n, ok := x.byHash[h]
			if !ok {
				continue // stored before a reset: never claimed
			}
			delete(x.byHash, h)
			if x.names[n]--; x.names[n] <= 0 {
				delete(x.names, n)
			}
		}
	case BlockStored:
		if !onGPU(e.Medium) {
			return
		}
		parent := x.chain.Root
		if e.LoRA >= 0 {
			parent = orphanRoot ^ uint64(e.LoRA+1)
		} else if e.Parent != "" {
			p, ok := x.byHash[e.Parent]
			if !ok {
				p = orphanRoot
			}
			parent = p
		}
		for i, h := range e.Hashes {
			n := x.chain.Step(parent, e.TokenIDs[i*e.BlockSize:(i+1)*e.BlockSize])
			if old, ok := x.byHash[h]; ok {
				if old == n {
					parent = n
					continue // stored again: still one block
				}
				if x.names[old]--; x.names[old] <= 0 {
					delete(x.names, old)
				}
			}
			x.byHash[h] = n
			x.names[n]++
			x.since++
			parent = n
		}
	}
}

func (x *Index) checkWholeLocked() {
	if !x.whole && x.capacity > 0 && x.since >= x.capacity {
		x.whole = true
	}
}

// Cached is how many of a prompt's leading blocks, named prefix[0],
// prefix[1], ... by the same Chain, the publisher holds; ok is false while
// the index is not whole, when the caller should not rely on it.
func (x *Index) Cached(prefix []uint64) (n int, ok bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, name := range prefix {
		if x.names[name] == 0 {
			break // names are chained: nothing after a miss can match
		}
		n++
	}
	return n, x.whole
}

// Has says whether the publisher holds a block named name.
func (x *Index) Has(name uint64) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.names[name] > 0
}

// Blocks is how many blocks the index knows the publisher holds, and
// whether it is whole.
func (x *Index) Blocks() (n int, whole bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byHash), x.whole
}
