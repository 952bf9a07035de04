package gateway

import (
	"bytes"
	"strconv"

	"github.com/valyala/fastjson"
)

// answer is what the gateway reads of a non-streamed answer: its usage
// (the backend's own counts, what the reservation is checked and the
// tokenizers calibrated against) and its choices, whose only finish
// reason teaches the output-length predictor when there is one choice.
type answer struct {
	hasUsage           bool // usage is an object
	prompt, completion int  // its prompt_tokens and completion_tokens (0: absent or not an integer)
	choices            int  // elements of choices (0: absent or not an array)
	finish             []byte
	hasFinish          bool // choices[0].finish_reason is a string, finish
}

// readAnswer reads body as parseAnswer would, without a parse tree where
// it can: one pass that walks the top level, usage and the first choice,
// and skips the rest. An answer the scan cannot read as the parser would
// (a key written with escapes, a finish reason with escapes, a key it
// reads given twice, broken syntax where it walks) is parsed with a parser
// from pp. ok is
// false when the answer is not a JSON object the parser reads. Like the
// stream's event scan, it checks the syntax of what it walks, not of the
// values it skips: an answer broken inside a message, which only a broken
// backend sends, is read for its usage where the parse would read nothing.
func readAnswer(pp *fastjson.ParserPool, body []byte) (answer, bool) {
	if a, ok := scanAnswer(body); ok {
		return a, true
	}
	p := pp.Get()
	defer pp.Put(p)
	return parseAnswer(p, body)
}

// scanAnswer is readAnswer's scan; ok false sends the answer to the parser.
// It walks the answer once, as the stream's event scan walks an event, and
// refuses (leaves to the parser) a key it reads that appears twice.
func scanAnswer(body []byte) (a answer, ok bool) {
	s := eventScan{b: body}
	var seen uint8
	ok = s.object(func(key []byte) bool {
		switch string(key) {
		case "usage":
			return once(&seen, 1) && s.usage(&a)
		case "choices":
			return once(&seen, 2) && s.choices(&a)
		}
		return s.skip()
	}) && s.end()
	return a, ok
}

// usage consumes an answer's usage: an object, or anything else (no usage).
func (s *eventScan) usage(a *answer) bool {
	if !s.at('{') {
		return s.skip()
	}
	a.hasUsage = true
	var seen uint8
	return s.object(func(key []byte) bool {
		switch string(key) {
		case "prompt_tokens":
			return once(&seen, 1) && s.integer(&a.prompt)
		case "completion_tokens":
			return once(&seen, 2) && s.integer(&a.completion)
		}
		return s.skip()
	})
}

// integer consumes a value, into n as jsonInt reads it.
func (s *eventScan) integer(n *int) bool {
	v, ok := s.value()
	*n = jsonInt(v)
	return ok
}

// choices consumes an answer's choices: an array, whose first element's
// finish_reason is read, or anything else (no choices).
func (s *eventScan) choices(a *answer) bool {
	if !s.eat('[') {
		return s.skip()
	}
	for more := !s.eat(']'); more; {
		var ok bool
		if a.choices == 0 && s.at('{') {
			ok = s.firstChoice(a)
		} else {
			ok = s.skip()
		}
		a.choices++
		if !ok {
			return false
		}
		if more, ok = s.next(']'); !ok {
			return false
		}
	}
	return true
}

// firstChoice consumes the first choice of an answer, an object.
func (s *eventScan) firstChoice(a *answer) bool {
	var seen uint8
	return s.object(func(key []byte) bool {
		if string(key) != "finish_reason" {
			return s.skip()
		}
		v, ok := s.value()
		switch {
		case !ok || !once(&seen, 1) || bytes.IndexByte(v, '\\') >= 0:
			return false
		case len(v) >= 2 && v[0] == '"':
			a.finish, a.hasFinish = v[1:len(v)-1], true
		}
		return true
	})
}

// parseAnswer reads body with a parse tree. The answer's bytes are not
// kept (finish is copied out of p's memory).
func parseAnswer(p *fastjson.Parser, body []byte) (a answer, ok bool) {
	v, err := p.ParseBytes(body)
	if err != nil || v.Type() != fastjson.TypeObject {
		return a, false
	}
	if u := v.Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
		a.hasUsage = true
		a.prompt, a.completion = u.GetInt("prompt_tokens"), u.GetInt("completion_tokens")
	}
	choices := v.GetArray("choices")
	a.choices = len(choices)
	if len(choices) > 0 {
		if fr := choices[0].Get("finish_reason"); fr != nil && fr.Type() == fastjson.TypeString {
			a.finish, a.hasFinish = bytes.Clone(fr.GetStringBytes()), true
		}
	}
	return a, true
}

// jsonInt is a JSON number that is an integer within int as written (no
// fraction or exponent), else 0: what fastjson's GetInt reads.
func jsonInt(raw []byte) int {
	if len(raw) == 0 || raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0
	}
	n, err := strconv.ParseInt(string(raw), 10, 0)
	if err != nil {
		return 0
	}
	return int(n)
}
