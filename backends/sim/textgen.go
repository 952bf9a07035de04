package sim

// Generated text is drawn from a fixed list of pieces that are each exactly
// one token of the simulator's tokenizer (a space and at most three letters,
// or one punctuation mark), so the completion_tokens a response reports is
// what /tokenize says of its text. None needs escaping in JSON.
var outputPieces = [64]string{
	" the", " of", " and", " to", " in", " is", " it", " you",
	" for", " on", " are", " as", " was", " his", " he", " at",
	" be", " by", " we", " or", " an", " not", " but", " can",
	" all", " one", " had", " has", " her", " my", " so", " do",
	" no", " up", " if", " out", " new", " use", " way", " may",
	" day", " get", " how", " now", " our", " see", " two", " who",
	" its", " did", " set", " put", " end", " why", " let", " old",
	" far", " big", " own", " few", " yes", " run", ",", ".",
}

// outputPieceIDs are the token ids of outputPieces, so that the prefix cache
// hashes generated blocks by the ids the tokenizer gives their text. Each
// piece is one token and none merges with its neighbours (each starts with a
// space or is a lone punctuation mark), so the ids of a generated text are
// exactly these, piece by piece. Computed once, never written.
var outputPieceIDs = func() (ids [len(outputPieces)]int) {
	for i, p := range outputPieces {
		ids[i] = pieceID([]byte(p))
	}
	return ids
}()

// seqKey is the key of sequence i of the request with key reqKey.
func seqKey(reqKey uint64, i int) uint64 { return mix(reqKey ^ mix(uint64(i)+1)) }

// piece is the text of token t (0-based) of the sequence with key k.
func piece(k uint64, t int) string { return outputPieces[pieceIndex(k, t)] }

// outputTokenID is the token id of token t of the sequence with key k.
func outputTokenID(k uint64, t int) int { return outputPieceIDs[pieceIndex(k, t)] }

func pieceIndex(k uint64, t int) uint64 {
	return mix(k^saltText^uint64(t)*0x9e3779b97f4a7c15) & 63
}

// appendText appends tokens [from, to) of sequence k.
func appendText(dst []byte, k uint64, from, to int) []byte {
	for t := from; t < to; t++ {
		dst = append(dst, piece(k, t)...)
	}
	return dst
}
