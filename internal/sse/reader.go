package sse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
)

// How an upstream event stream can end badly, told apart for the client's
// final error event and for the outcome's reason.
var (
	// ErrTruncated: the backend closed the stream in the middle of an
	// event, or after its last complete event without sending [DONE].
	ErrTruncated = errors.New("the backend's stream ended before [DONE]")
	// ErrTooLarge: a line (or event) past the reader's bound (the gateway's
	// server.max_sse_line_bytes).
	ErrTooLarge = errors.New("the backend sent an event larger than the gateway's bound")
)

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 32<<10) }}

// Reader cuts an upstream SSE stream into events (the lines up to and
// including a blank line), holding at most max bytes of one event: a line
// that never ends cannot grow the gateway's memory past that.
type Reader struct {
	br  *bufio.Reader
	max int
	ev  []byte // the event being read; reused
}

// NewReader reads r, holding at most max bytes of one event.
func NewReader(r io.Reader, max int64) *Reader {
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(r)
	return &Reader{br: br, max: int(max)}
}

// Release returns the buffer; the reader is unusable after.
func (er *Reader) Release() {
	if er.br != nil {
		er.br.Reset(nil)
		readerPool.Put(er.br)
		er.br = nil
	}
}

// Buffered says whether more of the stream is already in memory (so a
// flush can wait for it).
func (er *Reader) Buffered() bool { return er.br.Buffered() > 0 }

// Next returns the Next complete event, valid until the following call.
// At the stream's end it returns io.EOF — or, with a partial event left
// over, errStreamTruncated, except that a final "data: [DONE]" whose blank
// line never came is completed and returned (it is what every client waits
// for, and nothing about it is uncertain).
func (er *Reader) Next() ([]byte, error) {
	er.ev = er.ev[:0]
	lineStart := 0
	for {
		chunk, err := er.br.ReadSlice('\n')
		if len(er.ev)+len(chunk) > er.max {
			return nil, fmt.Errorf("%w (%d bytes)", ErrTooLarge, er.max)
		}
		er.ev = append(er.ev, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue // a line longer than the buffer: keep collecting, bounded above
		}
		if err == nil {
			if blank(er.ev[lineStart:]) {
				return er.ev, nil // a blank line ends the event
			}
			lineStart = len(er.ev)
			continue
		}
		if !errors.Is(err, io.EOF) {
			return nil, err
		}
		rest := bytes.TrimSpace(er.ev)
		switch {
		case len(rest) == 0:
			return nil, io.EOF
		case bytes.Equal(Data(rest), []byte("[DONE]")):
			er.ev = append(append(er.ev[:0], rest...), "\n\n"...)
			return er.ev, nil
		}
		return nil, ErrTruncated
	}
}

// blank says whether a line holds nothing but line-ending bytes: the line
// that ends an event. (bytes.TrimRight with a cutset builds the set on
// every call, for every line of every stream.)
func blank(line []byte) bool {
	for _, c := range line {
		if c != '\r' && c != '\n' {
			return false
		}
	}
	return true
}
