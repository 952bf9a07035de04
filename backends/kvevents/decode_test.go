package kvevents

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// The same batch as vLLM writes it in each encoding, built field by field
// with the msgpack library rather than by Encode, so that Decode is checked
// against the wire format, not against its own inverse.
func handBuilt(t *testing.T) map[string][]byte {
	t.Helper()
	positional := []any{
		1733500000.25,
		[]any{
			[]any{"BlockStored", []any{uint64(0xfeedface00000001), int64(-7)}, nil, []any{1, 2, 3, 4, 5, 6, 7, 8}, 4, nil, "GPU"},
			[]any{"BlockStored", []any{[]byte("sha-256-digest-bytes")}, int64(-7), []any{9, 10, 11, 12}, 4, 3, nil, "lora-name"},
			[]any{"BlockRemoved", []any{int64(-7)}, "GPU"},
			[]any{"BlockRemoved", []any{uint64(0xfeedface00000001)}, "CPU"},
			[]any{"AllBlocksCleared"},
		},
		2,
	}
	mapped := map[string]any{
		"ts": 1733500000.25,
		"events": []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(0xfeedface00000001), int64(-7)}, "parent_block_hash": nil,
				"token_ids": []any{1, 2, 3, 4, 5, 6, 7, 8}, "block_size": 4, "lora_id": nil, "medium": "GPU"},
			map[string]any{"type": "BlockStored", "block_hashes": []any{[]byte("sha-256-digest-bytes")}, "parent_block_hash": int64(-7),
				"token_ids": []any{9, 10, 11, 12}, "block_size": 4, "lora_id": 3, "lora_name": "lora-name"},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{int64(-7)}, "medium": "GPU"},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{uint64(0xfeedface00000001)}, "medium": "CPU"},
			map[string]any{"type": "AllBlocksCleared"},
		},
		"data_parallel_rank": 2,
	}
	out := map[string][]byte{}
	for name, v := range map[string]any{"positional": positional, "map": mapped} {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	return out
}

func wantBatch() Batch {
	minus7 := IntHash(uint64(0xfffffffffffffff9))
	return Batch{TS: 1733500000.25, DPRank: 2, Events: []Event{
		{Kind: BlockStored, Hashes: []Hash{IntHash(0xfeedface00000001), minus7}, TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, LoRA: -1, Medium: "GPU"},
		{Kind: BlockStored, Hashes: []Hash{Hash("sha-256-digest-bytes")}, Parent: minus7, TokenIDs: []uint32{9, 10, 11, 12}, BlockSize: 4, LoRA: 3},
		{Kind: BlockRemoved, Hashes: []Hash{minus7}, LoRA: -1, Medium: "GPU"},
		{Kind: BlockRemoved, Hashes: []Hash{IntHash(0xfeedface00000001)}, LoRA: -1, Medium: "CPU"},
		{Kind: AllBlocksCleared, LoRA: -1},
	}}
}

func TestDecodeBothEncodings(t *testing.T) {
	for name, payload := range handBuilt(t) {
		t.Run(name, func(t *testing.T) {
			got, err := Decode(payload)
			if err != nil {
				t.Fatal(err)
			}
			if want := wantBatch(); !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	for _, enc := range []Encoding{Positional, Map} {
		b := wantBatch()
		b.Events[1].Medium = "GPU"
		payload, err := Encode(b, enc)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(payload)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, b) {
			t.Fatalf("encoding %d: decoded\n%+v\nwant\n%+v", enc, got, b)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
	}{
		{"not a batch", "hello"},
		{"short array", []any{1.0}},
		{"events not a list", []any{1.0, 5}},
		{"unknown event", []any{1.0, []any{[]any{"BlockMoved", []any{1}}}}},
		{"tag not a string", []any{1.0, []any{[]any{7, []any{1}}}}},
		{"ids not matching blocks", []any{1.0, []any{[]any{"BlockStored", []any{1, 2}, nil, []any{1, 2, 3}, 2, nil, nil}}}},
		{"zero block size", []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{}, 0, nil, nil}}}},
		{"negative token", []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1, nil, nil}}}},
		{"hash a float", []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}, nil}}}},
		{"map without type", map[string]any{"ts": 1.0, "events": []any{map[string]any{"block_hashes": []any{1}}}}},
		{"map without events", map[string]any{"ts": 1.0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := msgpack.Marshal(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Decode(b); err == nil {
				t.Fatal("decoded; want an error")
			}
		})
	}
	if _, err := Decode([]byte{0xc1}); err == nil {
		t.Fatal("decoded a never-used msgpack byte")
	}
}

func FuzzDecode(f *testing.F) {
	for _, b := range handBuilt(&testing.T{}) {
		f.Add(b)
	}
	f.Add([]byte{0x92, 0xcb})
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload)
		if err != nil {
			return
		}
		for _, e := range b.Events {
			if e.Kind == BlockStored && len(e.TokenIDs) != len(e.Hashes)*e.BlockSize {
				t.Fatalf("stored event with %d ids for %d blocks of %d", len(e.TokenIDs), len(e.Hashes), e.BlockSize)
			}
		}
	})
}

// readFrames reads a recorded stream: each message a 4-byte big-endian
// count of frames, then each frame a 4-byte big-endian length and its
// bytes (as backends/sim's TestRecordKVEvents writes it).
func readFrames(t *testing.T, path string) [][][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	next := func() uint32 {
		if len(b) < 4 {
			t.Fatalf("%s: truncated", path)
		}
		n := binary.BigEndian.Uint32(b)
		b = b[4:]
		return n
	}
	var msgs [][][]byte
	for len(b) > 0 {
		frames := make([][]byte, next())
		for i := range frames {
			n := next()
			if uint32(len(b)) < n {
				t.Fatalf("%s: truncated frame", path)
			}
			frames[i], b = b[:n], b[n:]
		}
		msgs = append(msgs, frames)
	}
	return msgs
}

// A stream recorded off the simulator's publisher (sessions sharing a
// system prompt, second turns, an eviction) decodes in both encodings to
// the same batches, numbered from 0 without a gap, and builds the same
// index.
func TestDecodeRecordedSimulatorStream(t *testing.T) {
	decoded := map[string][]Batch{}
	blocks := map[string]int{}
	for _, enc := range []string{"positional", "map"} {
		x := NewIndex(testChain)
		x.Reset(true) // the stream is the publisher's from its start
		kinds := map[Kind]int{}
		for i, frames := range readFrames(t, filepath.Join("testdata", "sim-"+enc+".frames")) {
			if string(frames[0]) != "kv" {
				t.Fatalf("%s: message %d has topic %q", enc, i, frames[0])
			}
			seq, b, err := parseMessage(frames)
			if err != nil || seq != int64(i) {
				t.Fatalf("%s: message %d: sequence %d, %v", enc, i, seq, err)
			}
			for _, e := range b.Events {
				kinds[e.Kind]++
			}
			x.Apply(b)
			decoded[enc] = append(decoded[enc], b)
		}
		if kinds[BlockStored] == 0 || kinds[BlockRemoved] == 0 {
			t.Errorf("%s: events by kind %v, want stored and removed ones", enc, kinds)
		}
		n, whole := x.Blocks()
		if n == 0 || !whole {
			t.Errorf("%s: index of %d blocks, whole %v", enc, n, whole)
		}
		blocks[enc] = n
	}
	if !reflect.DeepEqual(decoded["positional"], decoded["map"]) {
		t.Error("the encodings decode to different batches")
	}
	if blocks["positional"] != blocks["map"] {
		t.Errorf("indexes of %d and %d blocks", blocks["positional"], blocks["map"])
	}
}
