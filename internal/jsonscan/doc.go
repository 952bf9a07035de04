// Package jsonscan finds one member of a JSON object without decoding the
// rest: a backend's answer carries what the gateway needs (a /tokenize
// count, a completion's usage) beside what it does not (every token id, the
// generated text), and skipping the latter over its bytes costs a fraction
// of building a tree of it.
//
// It validates only what it walks through: strings, brackets and commas at
// the top level. It never reads past the end of its input, and for every
// object a JSON parser accepts it finds the same first member (its fuzz
// test checks this against fastjson).
package jsonscan
