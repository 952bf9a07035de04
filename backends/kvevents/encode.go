package kvevents

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding is one of vLLM's two ways of writing a batch.
type Encoding uint8

const (
	// Positional writes msgspec's array_like structs: [ts, events, rank],
	// each event [tag, fields...]. vLLM's own structs are declared so.
	Positional Encoding = iota
	// Map writes each struct as a map of its field names, the event's tag
	// under "type": msgspec's default for structs.
	Map
)

// Encode writes b as a vLLM publisher does, in enc. Integer hashes (8
// bytes, as IntHash makes them) are written as integers, others as bytes.
func Encode(b Batch, enc Encoding) ([]byte, error) {
	events := make([]any, len(b.Events))
	for i, e := range b.Events {
		events[i] = encodeEvent(e, enc)
	}
	var v any
	if enc == Map {
		m := map[string]any{"ts": b.TS, "events": events}
		if b.DPRank >= 0 {
			m["data_parallel_rank"] = b.DPRank
		}
		v = m
	} else {
		l := []any{b.TS, events}
		if b.DPRank >= 0 {
			l = append(l, b.DPRank)
		}
		v = l
	}
	out, err := msgpack.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("kvevents: encode batch: %w", err)
	}
	return out, nil
}

func encodeEvent(e Event, enc Encoding) any {
	tag := e.Kind.String()
	var names []string
	var vals []any
	switch e.Kind {
	case BlockStored:
		ids := make([]uint64, len(e.TokenIDs))
		for i, id := range e.TokenIDs {
			ids[i] = uint64(id)
		}
		var parent, lora, medium any
		if e.Parent != "" {
			parent = hashValue(e.Parent)
		}
		if e.LoRA >= 0 {
			lora = e.LoRA
		}
		if e.Medium != "" {
			medium = e.Medium
		}
		names = positional[BlockStored]
		vals = []any{hashValues(e.Hashes), parent, ids, e.BlockSize, lora, medium}
	case BlockRemoved:
		var medium any
		if e.Medium != "" {
			medium = e.Medium
		}
		names = positional[BlockRemoved]
		vals = []any{hashValues(e.Hashes), medium}
	}
	if enc == Map {
		m := map[string]any{"type": tag}
		for i, n := range names {
			m[n] = vals[i]
		}
		return m
	}
	return append([]any{tag}, vals...)
}

func hashValue(h Hash) any {
	if len(h) == 8 {
		var v uint64
		for i := range 8 {
			v = v<<8 | uint64(h[i])
		}
		return v
	}
	return []byte(h)
}

func hashValues(hs []Hash) []any {
	out := make([]any, len(hs))
	for i, h := range hs {
		out[i] = hashValue(h)
	}
	return out
}
