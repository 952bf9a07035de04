// Package accesslog writes the gateway's access line: one line per
// proxied request, with the same fields in the same order (Line), in the
// format of the gateway's logger. A Writer encodes each line straight into
// a buffer, byte for byte what slog's TextHandler or JSONHandler would
// write for the same record (TestAccessLineMatchesSlog holds it to that),
// but without a record, an attribute slice or a write per line: a proxy
// that logs every request pays for the line as nginx does, not more.
// Where no Writer is set up, Line.Attrs gives the line to a logger's own
// handler.
//
// Invariants: only whole lines reach the output, so they interleave with
// the logger's other lines line by line; a line waits at most FlushEvery
// (on the clock the Writer is given) or until FlushBytes are buffered;
// writing a line allocates nothing.
package accesslog
