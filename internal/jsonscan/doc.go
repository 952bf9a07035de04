// Package jsonscan finds members of a JSON object, or the elements of an
// array, without decoding the rest: a backend's answer carries what the
// gateway needs (a /tokenize count, a completion's usage) beside what it
// does not (every token id, the generated text), and a request's prompt
// keys the tokenize cache as the client wrote it; skipping the rest over
// its bytes costs a fraction of building a tree of it.
//
// It validates only what it walks through: strings, brackets and commas at
// the level it walks. It never reads past the end of its input, and for
// every document a JSON parser accepts it finds the same values (its fuzz
// tests check this against fastjson). Keys are compared as written; where
// a key written with escapes could make it miss what a parser finds,
// Lookup says so (ErrEscapedKey). Skip, SkipSpace and After are the steps
// its walks are made of, for a scanner of its own that walks a document's
// known shape (the relay's test for a token event).
//
// Grammar (grammar.go). fastjson is lenient where Python's json, which
// reads the same documents again behind the gateway, is not: it takes a
// raw control character or a bad escape inside a string, and 00, +1, .5
// or nan for numbers, and it keeps the first of a repeated key where
// Python keeps the last. InvalidString, InvalidNumber and Duplicate find
// what a strict parser would refuse or read otherwise, so that a document
// is refused once, up front, rather than read two ways.
//
// Writing (quote.go). AppendString writes a string with JSON's escapes
// only (fastjson quotes the Go way, \x00), for documents built from
// pieces of others.
package jsonscan
