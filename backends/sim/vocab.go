package sim

import (
	"strings"
	"sync"
)

// vocab turns token ids back into text, for /detokenize. The tokenizer's
// ids are hashes of their pieces, so an id cannot be read back by itself:
// the vocab learns each piece as /tokenize meets it. Its size is bounded by
// construction, since an id holds one piece: at most vocabSize entries of
// at most five bytes each, the five special tokens aside. The special
// tokens and every piece the simulator generates are known from the start,
// so generated text decodes without having been tokenized.
//
// Two pieces that hash to one id share it, as they do in /tokenize's
// answers; the id decodes to the latest of them to be tokenized, so that
// /tokenize then /detokenize gives back the text just tokenized.
type vocab struct {
	mu     sync.RWMutex
	pieces map[int]string
}

func newVocab() *vocab {
	v := &vocab{pieces: make(map[int]string, len(outputPieces)+8)}
	for i, p := range outputPieces {
		v.pieces[outputPieceIDs[i]] = p
	}
	for id, s := range map[int]string{tokBOS: "<|begin_of_text|>", tokStartHdr: "<|start_header_id|>",
		tokEndHdr: "<|end_header_id|>", tokEOT: "<|eot_id|>", tokHdrSep: "\n\n"} {
		v.pieces[id] = s
	}
	return v
}

// learn records the pieces of text, under one lock; a piece already known
// costs no allocation.
func (v *vocab) learn(text []byte) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for len(text) > 0 {
		n := nextPiece(text)
		piece := text[:n]
		id := pieceID(piece)
		if cur, ok := v.pieces[id]; !ok || cur != string(piece) {
			v.pieces[id] = string(piece)
		}
		text = text[n:]
	}
}

// decode is the text of ids, or the first id it cannot decode: one outside
// the vocabulary, or one no piece the simulator has tokenized or
// generated has.
func (v *vocab) decode(ids []int) (text string, bad int, ok bool) {
	var b strings.Builder
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, id := range ids {
		p, known := v.pieces[id]
		if !known {
			return "", id, false
		}
		b.WriteString(p)
	}
	return b.String(), 0, true
}
