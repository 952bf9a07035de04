package gateway

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"unicode/utf8"
)

// estimator counts a prompt the backend's /tokenize did not count (a
// backend without one, one that failed or timed out, tokenizer: estimate,
// content /tokenize cannot take), and never below the backend's count.
//
// The bound. A byte-level BPE tokenizer, or a SentencePiece one with byte
// fallback, never makes a token of less than one byte of text, so a
// prompt's text takes at most its UTF-8 bytes in tokens. The chat template
// adds its own tokens: template_tokens a prompt (BOS, the generation
// prompt, a default system preamble), per_message_tokens a message (its
// header, role and end), per_tool_tokens a tool definition, and a token
// for each element of a JSON value a template may lay out again (tools and
// tool calls rendered with newlines and indents). An image is the model's
// largest image (imageTokens). That sum is the bound, and it is what an
// estimate says until calibration has earned a tighter one.
//
// Calibration. The text is also cut into pieces by a rough rule of the
// way BPE vocabularies cut (textPieces: about four letters, three digits,
// one punctuation mark or one non-ASCII character a piece), which follows
// how dense in tokens the text is far better than its bytes do; with a
// nominal two pieces a message and a tool, that is a prompt's size u. The
// answers' usage.prompt_tokens give points (u, real count); calibration
// keeps the last window of them and fits the line a·u + b that lies on or
// above every point (an upper envelope, not a mean: the densest prompts of
// the mix are covered) with the least room on average above them; the
// intercept learns the template's real overhead, which the bound can only
// over-state. Once minSamples answers are in, the estimate is that line
// plus the margin. An answer whose prompt_tokens passes what the estimate
// would have said for it throws the window away (widened): the estimate
// is the bound again until minSamples answers have come since, so a wrong
// guess makes every later one safer, never bolder. The estimate is never
// above the bound.
//
// The fit reads the whole window, so it is not redone for every answer:
// only for one that lies above the line (the line must cover it), while
// the window is not yet past minSamples, and otherwise every refitEvery
// answers. Between fits the line is still on or above every point of the
// window — a point that leaves can only let the least line come down — so
// it may over-state a little longer, never under-state.
type estimator struct {
	cfg         EstimateConfig
	imageTokens int // the model's largest image: its config's, else the configured image_tokens

	mu      sync.Mutex // guards the fields below
	ring    []point    // the last answers, at most cfg.CalibrationWindow
	next    int        // where the next point goes once ring is full
	a, b    float64    // the envelope a·u + b over ring
	unfit   int        // answers added to ring since a and b were fitted
	hull    []point    // envelope's scratch: the window's upper hull
	widened int64      // answers that passed their estimate
}

// refitEvery is how many answers below the line may come before the line
// is fitted again to the window (at most a fit's cost per that many
// answers: the fit sorts the window and reads its hull about a hundred
// times).
const refitEvery = 32

// point is one answer: its prompt's size u and the backend's count.
type point struct{ u, real float64 }

func newEstimator(c EstimateConfig, imageTokens int) *estimator {
	return &estimator{cfg: c, imageTokens: imageTokens}
}

func (e *estimator) sameConfig(c EstimateConfig, imageTokens int) bool {
	return e.cfg == c && e.imageTokens == imageTokens
}

// promptShape is what an estimate needs to know of a prompt.
type promptShape struct {
	textBytes int // UTF-8 bytes of text (content, tools and tool calls as JSON)
	pieces    int // textPieces of the same text
	layout    int // elements of JSON values a template may lay out on lines of their own
	messages  int // chat messages (template overhead each)
	tools     int // tool definitions
	images    int // non-text content parts
	tokenIDs  int // tokens given as ids: exact
	ids       bool
}

// addText counts b as prompt text.
func (s *promptShape) addText(b []byte) {
	s.textBytes += len(b)
	s.pieces += textPieces(b)
}

// textShape is the shape of a plain prompt of text b.
func textShape(b []byte) promptShape {
	var s promptShape
	s.addText(b)
	return s
}

// addJSON counts a JSON value (tools, a tool call) as prompt text that a
// chat template may render again laid out on lines, as Jinja's
// tojson(indent=4) does: each element on a line of its own, a line break
// and four spaces of indent a level. Whatever the tokenizer, that is at
// most one token for the break and one a level of indent (no tokenizer
// has a whitespace token shorter than a byte, and every one has the
// four-space indent) an element: layout counts them.
func (s *promptShape) addJSON(b []byte) {
	s.addText(b)
	depth, str := 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case str && c == '\\':
			i++
		case c == '"':
			str = !str
		case str:
		case c == '{' || c == '[':
			depth++
			s.layout += 1 + depth
		case c == '}' || c == ']':
			depth = max(depth-1, 0)
			s.layout += 1 + depth
		case c == ',':
			s.layout += 1 + depth
		}
	}
}

// textPieces is a tokenizer-free count of the pieces b would be cut into:
// a run of ASCII letters a piece every four bytes, digits in threes, a
// newline run, a run of spaces that no word takes, each other ASCII byte
// and each character of two bytes a piece; characters of three bytes
// (CJK) one and a half, of four (emoji) two and a half.
// It is no bound; calibration scales it.
func textPieces(b []byte) int {
	n, wide := 0, 0
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c|0x20 >= 'a' && c|0x20 <= 'z':
			j := i + 1
			for j < len(b) && b[j]|0x20 >= 'a' && b[j]|0x20 <= 'z' {
				j++
			}
			n += (j - i + 3) / 4
			i = j
		case c >= '0' && c <= '9':
			j := i + 1
			for j < len(b) && b[j] >= '0' && b[j] <= '9' {
				j++
			}
			n += (j - i + 2) / 3
			i = j
		case c == ' ' || c == '\t':
			j := i + 1
			for j < len(b) && (b[j] == ' ' || b[j] == '\t') {
				j++
			}
			if j-i > 1 || j == len(b) || b[j] < 'A' {
				n++ // a single space before a word goes with the word
			}
			i = j
		case c == '\n' || c == '\r':
			for i < len(b) && (b[i] == '\n' || b[i] == '\r') {
				i++
			}
			n++
		case c < utf8.RuneSelf:
			n++
			i++
		default:
			// A CJK character is one token or two in real vocabularies
			// (the frequent ones have their own), an emoji two or three:
			// one and a half and two and a half pieces on average.
			_, size := utf8.DecodeRune(b[i:])
			switch size {
			case 3:
				wide++
				n += 1 + wide%2
			case 4:
				wide++
				n += 2 + wide%2
			default:
				n++
			}
			i += size
		}
	}
	return n
}

// overhead is the template's tokens around s's text.
func (e *estimator) overhead(s promptShape) int {
	if s.messages == 0 {
		return specialTokens // a plain prompt: the tokenizer's BOS (and EOS)
	}
	return e.cfg.TemplateTokens + s.messages*e.cfg.PerMessageTokens + s.tools*e.cfg.PerToolTokens
}

// specialTokens is what a tokenizer adds to a plain prompt: BOS, and EOS or
// SEP for the encoders pooling models use.
const specialTokens = 2

// bound is the most tokens s can take.
func (e *estimator) bound(s promptShape) int {
	if s.ids {
		return s.tokenIDs
	}
	return s.textBytes + s.layout + e.overhead(s) + s.images*e.imageTokens + s.tokenIDs
}

// predict returns the estimated prompt tokens for s: the bound, or the
// calibrated line where it is below it.
func (e *estimator) predict(s promptShape) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.predictLocked(s)
}

func (e *estimator) predictLocked(s promptShape) int {
	b := e.bound(s)
	if !e.earnedLocked() || s.ids {
		return b
	}
	text := e.bound(promptShape{textBytes: s.textBytes, layout: s.layout, messages: s.messages, tools: s.tools})
	cal := int(math.Ceil((e.a*size(s) + e.b) * (1 + e.cfg.Margin)))
	return b - text + max(min(cal, text), 0)
}

// size is s's text in calibration's unit: its pieces, and two a message
// and a tool for the template's structure.
func size(s promptShape) float64 { return float64(s.pieces + 2*(s.messages+s.tools)) }

// earnedLocked says whether calibration has earned its line.
func (e *estimator) earnedLocked() bool { return len(e.ring) >= e.cfg.CalibrationMin }

// observe feeds back the backend's count of a prompt of shape s: it widens
// the estimate back to the bound if the count passes what the estimate
// says now, and calibrates on prompts of text alone (an image's bound is
// its largest, which says nothing of the text). widened reports the
// former.
func (e *estimator) observe(s promptShape, actual int) (widened bool) {
	if s.ids || actual <= 0 {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if actual > e.predictLocked(s) {
		e.widened++
		e.ring, e.next = e.ring[:0], 0
		widened = true
	}
	if s.images > 0 || s.tokenIDs > 0 {
		return widened
	}
	p := point{size(s), float64(actual)}
	if len(e.ring) < e.cfg.CalibrationWindow {
		e.ring = append(e.ring, p)
	} else {
		e.ring[e.next] = p
		e.next = (e.next + 1) % len(e.ring)
	}
	e.unfit++
	if len(e.ring) == 1 || p.real > e.a*p.u+e.b || len(e.ring) <= e.cfg.CalibrationMin || e.unfit >= refitEvery {
		e.a, e.b, e.hull = envelope(e.ring, e.hull)
		e.unfit = 0
	}
	return widened
}

// envelope is the line a·u + b on or above every point with the least
// mean room above them: it minimises f(a) = a·ū + max(real − a·u), which
// is convex in a, over a in [0, the largest real/u]; b is then that max.
// The search reads only the points on the window's upper hull (hull), as
// the max of real − a·u over them is the max over every point; b is read
// over every point, so that the line covers each exactly as computed.
func envelope(ps []point, hull []point) (a, b float64, scratch []point) {
	var mean, hi float64
	for _, p := range ps {
		mean += p.u
		hi = max(hi, p.real/max(p.u, 1))
	}
	mean /= float64(len(ps))
	hull = upperHull(append(hull[:0], ps...))
	lo := 0.0
	for range 48 {
		m1, m2 := lo+(hi-lo)/3, hi-(hi-lo)/3
		if m1*mean+above(hull, m1) <= m2*mean+above(hull, m2) {
			hi = m2
		} else {
			lo = m1
		}
	}
	a = (lo + hi) / 2
	return a, above(ps, a), hull
}

// above is the most any point lies above the line a·u (max real − a·u).
func above(ps []point, a float64) float64 {
	m := math.Inf(-1)
	for _, p := range ps {
		m = max(m, p.real-a*p.u)
	}
	return m
}

// upperHull sorts ps by u and keeps the vertices of their upper convex
// hull, in place: whatever the slope a, the point that lies most above
// the line a·u is one of them.
func upperHull(ps []point) []point {
	slices.SortFunc(ps, func(p, q point) int {
		if c := cmp.Compare(p.u, q.u); c != 0 {
			return c
		}
		return cmp.Compare(q.real, p.real) // the highest of one u first
	})
	h := ps[:0]
	for i, p := range ps {
		if i > 0 && p.u == ps[i-1].u {
			continue // below the first of its u
		}
		// Drop the last vertex while it lies on or below the chord from
		// the one before it to p.
		for len(h) >= 2 {
			o, m := h[len(h)-2], h[len(h)-1]
			if (m.u-o.u)*(p.real-o.real)-(m.real-o.real)*(p.u-o.u) < 0 {
				break
			}
			h = h[:len(h)-1]
		}
		h = append(h, p)
	}
	return h
}

// estimateState is the estimator's state for /status and the metrics.
type estimateState struct {
	Calibrated  bool    `json:"calibrated"`   // false: the byte bound
	Ratio       float64 `json:"ratio"`        // the envelope's tokens per piece (a); 0 before any answer
	Overhead    float64 `json:"overhead"`     // the envelope's tokens a prompt (b)
	Samples     int     `json:"samples"`      // answers in the window
	MinSamples  int     `json:"min_samples"`  // the answers calibration needs
	Widened     int64   `json:"widened"`      // answers that passed their estimate
	ImageTokens int     `json:"image_tokens"` // what an image is counted
	Margin      float64 `json:"margin"`       // on top of a calibrated estimate
}

func (e *estimator) state() estimateState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return estimateState{Calibrated: e.earnedLocked(), Ratio: e.a, Overhead: e.b, Samples: len(e.ring),
		MinSamples: e.cfg.CalibrationMin, Widened: e.widened, ImageTokens: e.imageTokens, Margin: e.cfg.Margin}
}
