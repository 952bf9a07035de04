// Package chunkscan reads an OpenAI-compatible stream's chunk without a
// parse when the chunk is certainly about choice 0 alone: a piece of
// text (a completion's text, a chat delta's content or reasoning) and a
// finish reason, and nothing else a relay acts on. Nearly every event of
// a stream is such a chunk, and one forward pass over its bytes tells it
// at a fraction of a parse; a Shape remembers the bytes around the last
// token's text, so that the next token event is told by two comparisons.
//
// Invariant: Scan answers ok only where a full parse would read the same
// choice, text and finish reason (fuzzed against the gateway's parse);
// whatever it is not sure of answers false, and the caller parses.
package chunkscan
