package kvevents

import (
	"encoding/binary"
	"hash/fnv"
	"testing"
)

// testChain names blocks as a gateway would: any chained hash will do, so
// long as names and prompts are made by the same one.
var testChain = Chain{Root: 1, Step: func(parent uint64, ids []uint32) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	h.Write(b[:])
	for _, id := range ids {
		binary.LittleEndian.PutUint32(b[:4], id)
		h.Write(b[:4])
	}
	return h.Sum64()
}}

// names is the chain of a prompt's full blocks of size bs.
func names(ids []uint32, bs int) []uint64 {
	var out []uint64
	p := testChain.Root
	for j := 0; (j+1)*bs <= len(ids); j++ {
		p = testChain.Step(p, ids[j*bs:(j+1)*bs])
		out = append(out, p)
	}
	return out
}

func stored(parent Hash, ids []uint32, bs int, hashes ...Hash) Event {
	return Event{Kind: BlockStored, Hashes: hashes, Parent: parent, TokenIDs: ids, BlockSize: bs, LoRA: -1}
}

func TestIndexFollowsEvents(t *testing.T) {
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	chain := names(prompt, 4)
	other := names([]uint32{1, 2, 3, 4, 9, 9, 9, 9}, 4)
	type step struct {
		events []Event
		prefix []uint64
		cached int
		blocks int
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"stored in two events, chained by parent", []step{
			{[]Event{stored("", prompt[:4], 4, "a")}, chain, 1, 1},
			{[]Event{stored("a", prompt[4:], 4, "b", "c")}, chain, 3, 3},
		}},
		{"a removal in the middle cuts the chain", []step{
			{[]Event{stored("", prompt, 4, "a", "b", "c"), {Kind: BlockRemoved, Hashes: []Hash{"b"}}}, chain, 1, 2},
		}},
		{"a branch shares its parent", []step{
			{[]Event{stored("", prompt, 4, "a", "b", "c"), stored("a", []uint32{9, 9, 9, 9}, 4, "x")}, other, 2, 4},
		}},
		{"an unknown parent is held but never matched", []step{
			{[]Event{stored("zz", prompt[4:8], 4, "b")}, chain[1:], 0, 1},
		}},
		{"a LoRA's blocks are not the base model's", []step{
			{[]Event{{Kind: BlockStored, Hashes: []Hash{"a"}, TokenIDs: prompt[:4], BlockSize: 4, LoRA: 2}}, chain, 0, 1},
		}},
		{"CPU blocks are not on the GPU", []step{
			{[]Event{{Kind: BlockStored, Hashes: []Hash{"a"}, TokenIDs: prompt[:4], BlockSize: 4, LoRA: -1, Medium: "CPU"}}, chain, 0, 0},
		}},
		{"the same content twice is held until both go", []step{
			{[]Event{stored("", prompt[:4], 4, "a"), stored("", prompt[:4], 4, "a2")}, chain, 1, 2},
			{[]Event{{Kind: BlockRemoved, Hashes: []Hash{"a"}}}, chain, 1, 1},
			{[]Event{{Kind: BlockRemoved, Hashes: []Hash{"a2"}}}, chain, 0, 0},
		}},
		{"removal of a block never seen changes nothing", []step{
			{[]Event{stored("", prompt[:4], 4, "a"), {Kind: BlockRemoved, Hashes: []Hash{"q"}}}, chain, 1, 1},
		}},
		{"cleared", []step{
			{[]Event{stored("", prompt, 4, "a", "b", "c"), {Kind: AllBlocksCleared}}, chain, 0, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewIndex(testChain)
			x.Reset(true)
			for i, s := range tc.steps {
				x.Apply(Batch{Events: s.events})
				n, ok := x.Cached(s.prefix)
				blocks, _ := x.Blocks()
				if n != s.cached || !ok || blocks != s.blocks {
					t.Fatalf("step %d: cached %d (whole %v), %d blocks; want %d, true, %d", i, n, ok, blocks, s.cached, s.blocks)
				}
			}
		})
	}
}

func TestIndexWholeAgain(t *testing.T) {
	x := NewIndex(testChain)
	if _, whole := x.Blocks(); whole {
		t.Fatal("a new index is whole before it knows the publisher's start")
	}
	x.Apply(Batch{Events: []Event{{Kind: AllBlocksCleared}}})
	if _, whole := x.Blocks(); !whole {
		t.Fatal("not whole after the publisher cleared its cache")
	}
	x.Reset(false)
	x.SetCapacity(3)
	x.Apply(Batch{Events: []Event{stored("", []uint32{1, 2, 3, 4}, 2, "a", "b")}})
	if _, whole := x.Blocks(); whole {
		t.Fatal("whole after 2 of 3 blocks stored since the reset")
	}
	x.Apply(Batch{Events: []Event{stored("b", []uint32{5, 6}, 2, "c")}})
	if _, whole := x.Blocks(); !whole {
		t.Fatal("not whole after the cache's capacity was stored since the reset")
	}
}
