package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
)

// Kind is what an event says happened to a publisher's cache.
type Kind uint8

// The event kinds vLLM publishes (vllm/distributed/kv_events.py); their
// names are the msgspec tags on the wire.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

var kindNames = map[string]Kind{
	"BlockStored":      BlockStored,
	"BlockRemoved":     BlockRemoved,
	"AllBlocksCleared": AllBlocksCleared,
}

func (k Kind) String() string {
	for n, v := range kindNames {
		if v == k {
			return n
		}
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Hash is a publisher's name for a block, opaque: vLLM sends an integer
// (older versions) or the bytes of a SHA-256 digest (newer ones), and
// changes how it computes them between versions, so the index never reads
// meaning into it — it only matches a removal or a parent to a stored
// block. An integer is kept as its 8 big-endian bytes.
type Hash string

// IntHash is the Hash of an integer block hash.
func IntHash(v uint64) Hash {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return Hash(b[:])
}

// Event is one entry of a batch. Fields not used by Kind are zero.
type Event struct {
	Kind   Kind
	Hashes []Hash
	// Parent is the hash of the block before Hashes[0]; "" when the first
	// block starts its sequence.
	Parent    Hash
	TokenIDs  []uint32
	BlockSize int
	// LoRA is the adapter's id, -1 for the base model.
	LoRA int64
	// Medium is where the blocks are ("GPU", "CPU", ...); "" when the
	// publisher does not say, which vLLM means as the GPU.
	Medium string
}

// Batch is one published message's payload: vLLM's KVEventBatch.
type Batch struct {
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank that published it; -1 if not sent.
	DPRank int64
}

// Decode reads a KVEventBatch in either of vLLM's encodings: the
// positional one (msgspec array_like structs: the batch an array
// [ts, events, dp_rank?], each event an array whose first element is its
// tag) or the map one (the batch {"ts", "events", "data_parallel_rank"},
// each event a map whose "type" is its tag). Unknown event kinds are an
// error: a batch only partly understood would leave the index wrong.
func Decode(payload []byte) (Batch, error) {
	// A length in an array or map header is trusted by the decoder's
	// DecodeInterface, which allocates it before reading one element: five
	// bytes of garbage could ask for gigabytes. Skipping walks the same
	// headers without allocating, so a frame whose lengths its bytes do not
	// back is refused before anything is built from it.
	if err := msgpack.NewDecoder(bytes.NewReader(payload)).Skip(); err != nil {
		return Batch{}, fmt.Errorf("kvevents: decode batch: %w", err)
	}
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	d.UseLooseInterfaceDecoding(true)
	v, err := d.DecodeInterface()
	if err != nil {
		return Batch{}, fmt.Errorf("kvevents: decode batch: %w", err)
	}
	b := Batch{DPRank: -1}
	var events []any
	switch t := v.(type) {
	case []any:
		if len(t) < 2 {
			return Batch{}, fmt.Errorf("kvevents: batch: an array of %d elements, want [ts, events, dp_rank?]", len(t))
		}
		if b.TS, err = asFloat(t[0]); err != nil {
			return Batch{}, fmt.Errorf("kvevents: batch ts: %w", err)
		}
		if events, err = asList(t[1]); err != nil {
			return Batch{}, fmt.Errorf("kvevents: batch events: %w", err)
		}
		if len(t) > 2 && t[2] != nil {
			if b.DPRank, err = asInt(t[2]); err != nil {
				return Batch{}, fmt.Errorf("kvevents: batch data_parallel_rank: %w", err)
			}
		}
	case map[string]any:
		if b.TS, err = asFloat(t["ts"]); err != nil {
			return Batch{}, fmt.Errorf("kvevents: batch ts: %w", err)
		}
		if events, err = asList(t["events"]); err != nil {
			return Batch{}, fmt.Errorf("kvevents: batch events: %w", err)
		}
		if r, ok := t["data_parallel_rank"]; ok && r != nil {
			if b.DPRank, err = asInt(r); err != nil {
				return Batch{}, fmt.Errorf("kvevents: batch data_parallel_rank: %w", err)
			}
		}
	default:
		return Batch{}, fmt.Errorf("kvevents: batch is a %T, want an array or a map", v)
	}
	b.Events = make([]Event, 0, len(events))
	for i, raw := range events {
		e, err := decodeEvent(raw)
		if err != nil {
			return Batch{}, fmt.Errorf("kvevents: event %d: %w", i, err)
		}
		b.Events = append(b.Events, e)
	}
	return b, nil
}

// Field order of the positional encoding, after the tag.
var positional = map[Kind][]string{
	BlockStored:      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"},
	BlockRemoved:     {"block_hashes", "medium"},
	AllBlocksCleared: {},
}

func decodeEvent(raw any) (Event, error) {
	var tag string
	fields := map[string]any{}
	switch t := raw.(type) {
	case []any:
		if len(t) == 0 {
			return Event{}, errors.New("an empty array, want [tag, fields...]")
		}
		s, ok := t[0].(string)
		if !ok {
			return Event{}, fmt.Errorf("tag is a %T, want a string", t[0])
		}
		tag = s
		if k, ok := kindNames[tag]; ok {
			// Fields vLLM added later (lora_name, extra keys) follow these:
			// a longer array is newer, not wrong.
			for i, name := range positional[k] {
				if 1+i < len(t) {
					fields[name] = t[1+i]
				}
			}
		}
	case map[string]any:
		s, ok := t["type"].(string)
		if !ok {
			return Event{}, fmt.Errorf("type is a %T, want a string", t["type"])
		}
		tag, fields = s, t
	default:
		return Event{}, fmt.Errorf("a %T, want an array or a map", raw)
	}
	k, ok := kindNames[tag]
	if !ok {
		return Event{}, fmt.Errorf("unknown event type %q", tag)
	}
	e := Event{Kind: k, LoRA: -1}
	if k == AllBlocksCleared {
		return e, nil
	}
	var err error
	if e.Hashes, err = asHashes(fields["block_hashes"]); err != nil {
		return Event{}, fmt.Errorf("%s block_hashes: %w", tag, err)
	}
	if m := fields["medium"]; m != nil {
		if e.Medium, ok = m.(string); !ok {
			return Event{}, fmt.Errorf("%s medium is a %T, want a string", tag, m)
		}
	}
	if k == BlockRemoved {
		return e, nil
	}
	if p := fields["parent_block_hash"]; p != nil {
		if e.Parent, err = asHash(p); err != nil {
			return Event{}, fmt.Errorf("%s parent_block_hash: %w", tag, err)
		}
	}
	ids, err := asList(fields["token_ids"])
	if err != nil {
		return Event{}, fmt.Errorf("%s token_ids: %w", tag, err)
	}
	e.TokenIDs = make([]uint32, len(ids))
	for i, id := range ids {
		v, err := asInt(id)
		if err != nil || v < 0 || v > math.MaxUint32 {
			return Event{}, fmt.Errorf("%s token_ids[%d]: %v is not a token id", tag, i, id)
		}
		e.TokenIDs[i] = uint32(v)
	}
	bs, err := asInt(fields["block_size"])
	if err != nil || bs < 1 {
		return Event{}, fmt.Errorf("%s block_size: %v is not a block size", tag, fields["block_size"])
	}
	e.BlockSize = int(bs)
	if len(e.TokenIDs) != len(e.Hashes)*e.BlockSize {
		return Event{}, fmt.Errorf("%s: %d token ids for %d blocks of %d", tag, len(e.TokenIDs), len(e.Hashes), e.BlockSize)
	}
	if l := fields["lora_id"]; l != nil {
		if e.LoRA, err = asInt(l); err != nil {
			return Event{}, fmt.Errorf("%s lora_id: %w", tag, err)
		}
	}
	return e, nil
}

func asList(v any) ([]any, error) {
	l, ok := v.([]any)
	if !ok && v != nil {
		return nil, fmt.Errorf("a %T, want an array", v)
	}
	if v == nil {
		return nil, errors.New("missing")
	}
	return l, nil
}

func asInt(v any) (int64, error) {
	switch t := v.(type) {
	case int64:
		return t, nil
	case uint64:
		if t > math.MaxInt64 {
			return 0, fmt.Errorf("%d is out of range", t)
		}
		return int64(t), nil
	}
	return 0, fmt.Errorf("a %T, want an integer", v)
}

func asFloat(v any) (float64, error) {
	switch t := v.(type) {
	case float64:
		return t, nil
	case float32:
		return float64(t), nil
	case int64:
		return float64(t), nil
	case uint64:
		return float64(t), nil
	}
	return 0, fmt.Errorf("a %T, want a number", v)
}

func asHash(v any) (Hash, error) {
	switch t := v.(type) {
	case int64:
		return IntHash(uint64(t)), nil
	case uint64:
		return IntHash(t), nil
	case []byte:
		return Hash(t), nil
	case string:
		return Hash(t), nil
	}
	return "", fmt.Errorf("a %T, want an integer or bytes", v)
}

func asHashes(v any) ([]Hash, error) {
	l, err := asList(v)
	if err != nil {
		return nil, err
	}
	hs := make([]Hash, len(l))
	for i, x := range l {
		if hs[i], err = asHash(x); err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return hs, nil
}
