// Package sse reads a server-sent event stream as an OpenAI-compatible
// backend sends it: Reader cuts it into whole events (the lines up to and
// including a blank line) and Data is an event's payload.
//
// Invariants: a Reader holds at most its bound of one event, so a line
// that never ends cannot grow the caller's memory past it (ErrTooLarge); a
// stream that ends inside an event, or without [DONE], is ErrTruncated
// rather than a quiet end. A Reader's buffer comes from a pool and goes
// back with Release; an event returned by Next is valid until the next call.
package sse
