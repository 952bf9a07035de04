package sim

import "unicode/utf8"

// The simulator's tokenizer is its own, on purpose: the gateway estimates
// prompt lengths with its own strategy and must not be able to share this
// code and predict the backend exactly. It behaves like a byte-level BPE:
// about four bytes a token on English text, and denser where real
// vocabularies are. A word (letters and two-byte runes: accented Latin,
// Cyrillic), with the space before it, is cut into pieces of at most four
// bytes (never inside a rune); digits go in threes; runs of spaces are
// pieces of their own, as is a line break with the indent after it (up to
// sixteen spaces); any other ASCII byte (code, JSON) is one token. A rune
// of three bytes (CJK) is one token or two, and one of four (emoji) two or
// three, by a hash of the rune, as a frequent character has a token of its
// own and a rare one falls back to byte pieces: about two bytes a token.
// Every token is at least one byte of text. A piece's id is a hash of its
// bytes; the special tokens of the Llama-3 chat template have their real
// ids.
const (
	vocabSize   = 128256 // ids are in [0, vocabSize), as Llama-3's
	plainVocab  = 128000 // ordinary pieces hash into [0, plainVocab)
	tokBOS      = 128000 // <|begin_of_text|>
	tokStartHdr = 128006 // <|start_header_id|>
	tokEndHdr   = 128007 // <|end_header_id|>
	tokEOT      = 128009 // <|eot_id|>
	tokHdrSep   = 271    // "\n\n" after a header, as Llama-3's
)

// isWordByte: ASCII letters, '_', and the bytes of runes of two bytes
// (lead bytes below 0xE0 and continuation bytes).
func isWordByte(c byte) bool {
	return (c >= 0x80 && c < 0xE0) || (c|0x20 >= 'a' && c|0x20 <= 'z') || c == '_'
}

// widePiece is the first piece of a rune of three or four bytes at the
// start of b; what it leaves of the rune is one token a byte.
func widePiece(b []byte) int {
	r, size := utf8.DecodeRune(b)
	if size < 3 {
		return 1 // not a valid rune: a byte
	}
	common := (uint32(r)*2654435761)>>15&1 == 0
	switch {
	case size == 3 && common:
		return 3 // one token
	case size == 3:
		return 2 // two
	case common:
		return 3 // two
	}
	return 2 // three
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// nextPiece returns the length of the token that starts b (len(b) > 0).
func nextPiece(b []byte) int {
	c := b[0]
	switch {
	case c >= 0xE0:
		return widePiece(b)
	case c >= 0x80 && c < 0xC0:
		return 1 // the rest of a rune widePiece split
	case c == ' ' && len(b) > 1 && isWordByte(b[1]) && (b[1] < 0x80 || b[1] >= 0xC0):
		n := 1 + wordPiece(b[1:], 3)
		if n == 1 { // a rune wordPiece will not take (invalid UTF-8): keep it with its space
			_, size := utf8.DecodeRune(b[1:])
			n += size
		}
		return n
	case isWordByte(c):
		if n := wordPiece(b, 4); n > 0 {
			return n
		}
		_, size := utf8.DecodeRune(b)
		return size
	case isDigit(c):
		n := 1
		for n < len(b) && n < 3 && isDigit(b[n]) {
			n++
		}
		return n
	case c == ' ' || c == '\t':
		n := 1
		for n < len(b) && n < 4 && (b[n] == ' ' || b[n] == '\t') {
			if b[n] == ' ' && n+1 < len(b) && isWordByte(b[n+1]) {
				break // this space belongs to the next word
			}
			n++
		}
		return n
	case c == '\n' || c == '\r':
		n := 1
		if len(b) > 1 && (b[1] == '\n' || b[1] == '\r') {
			n = 2
		}
		for m := n; n < len(b) && n < m+16 && b[n] == ' '; n++ {
			if n+1 < len(b) && isWordByte(b[n+1]) {
				break // this space belongs to the next word
			}
		}
		return n
	}
	return 1
}

// wordPiece is the length of the longest run of whole word runes at the
// start of b that fits in limit bytes.
func wordPiece(b []byte, limit int) int {
	n := 0
	for n < len(b) && isWordByte(b[n]) {
		size := 1
		if b[n] >= 0x80 {
			_, size = utf8.DecodeRune(b[n:])
			if size > 2 {
				break
			}
		}
		if n+size > limit {
			break
		}
		n += size
	}
	return n
}

// pieceID is the token id of an ordinary piece: FNV-1a of its bytes.
func pieceID(p []byte) int {
	h := uint64(14695981039346656037)
	for _, c := range p {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return int(h % plainVocab)
}

// countTokens is the number of tokens text takes.
func countTokens(text []byte) int {
	n := 0
	for len(text) > 0 {
		text = text[nextPiece(text):]
		n++
	}
	return n
}

// prompt accumulates what a request's prompt comes to: its token count,
// a hash of its content (for deterministic output), and, when ids is
// non-nil, the token ids and pieces themselves (for /tokenize).
type prompt struct {
	tokens  int
	hash    uint64
	ids     []int
	strs    []string
	collect bool
	strsToo bool
	blocks  blockHasher // on: the prefix cache's block hashes are wanted
	vocab   *vocab      // non-nil: the text's pieces are taught to it (/tokenize)
}

func newPrompt(collect, strs bool) prompt {
	return prompt{hash: 14695981039346656037, collect: collect, strsToo: strs}
}

func (p *prompt) hashBytes(b []byte) {
	h := p.hash
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	// A separator, so that ("ab","c") and ("a","bc") differ.
	p.hash = mix(h ^ uint64(len(b)))
}

func (p *prompt) special(id int, text string) {
	p.tokens++
	p.hash = mix(p.hash ^ uint64(id))
	if p.blocks.on() {
		p.blocks.add(id)
	}
	if p.collect {
		p.ids = append(p.ids, id)
		if p.strsToo {
			p.strs = append(p.strs, text)
		}
	}
}

func (p *prompt) text(b []byte) {
	p.hashBytes(b)
	if p.vocab != nil {
		p.vocab.learn(b)
	}
	if !p.collect && !p.blocks.on() {
		p.tokens += countTokens(b)
		return
	}
	for len(b) > 0 {
		n := nextPiece(b)
		id := pieceID(b[:n])
		if p.blocks.on() {
			p.blocks.add(id)
		}
		if p.collect {
			p.ids = append(p.ids, id)
			if p.strsToo {
				p.strs = append(p.strs, string(b[:n]))
			}
		}
		p.tokens++
		b = b[n:]
	}
}

// tokenIDs is a prompt given as token ids.
func (p *prompt) tokenID(id int) {
	p.tokens++
	p.hash = mix(p.hash ^ uint64(id))
	if p.blocks.on() {
		p.blocks.add(id)
	}
	if p.collect {
		p.ids = append(p.ids, id)
		if p.strsToo {
			p.strs = append(p.strs, "")
		}
	}
}

// The chat template is Llama-3's: <|begin_of_text|>, then per message
// <|start_header_id|>role<|end_header_id|>\n\n content <|eot_id|>, then the
// assistant header when a generation prompt is asked for.
func (p *prompt) chatBegin() { p.special(tokBOS, "<|begin_of_text|>") }

func (p *prompt) chatHeader(role []byte) {
	p.special(tokStartHdr, "<|start_header_id|>")
	p.text(role)
	p.special(tokEndHdr, "<|end_header_id|>")
	p.special(tokHdrSep, "\n\n")
}

func (p *prompt) chatEnd() { p.special(tokEOT, "<|eot_id|>") }

var assistantRole = []byte("assistant")

func (p *prompt) chatGenerationPrompt() { p.chatHeader(assistantRole) }
