package sse

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// eventsOf cuts a stream with a bound of max bytes.
func eventsOf(stream string, max int64) (events []string, err error) {
	er := NewReader(strings.NewReader(stream), max)
	defer er.Release()
	for {
		ev, err := er.Next()
		if err != nil {
			return events, err
		}
		events = append(events, string(ev))
	}
}

func TestEventReader(t *testing.T) {
	tests := []struct {
		name, stream string
		events       []string
		err          error
	}{
		{"events and [DONE]", "data: a\n\ndata: b\r\n\r\ndata: [DONE]\n\n", []string{"data: a\n\n", "data: b\r\n\r\n", "data: [DONE]\n\n"}, io.EOF},
		{"multi-line event", "event: x\ndata: 1\ndata: 2\n\n", []string{"event: x\ndata: 1\ndata: 2\n\n"}, io.EOF},
		{"a comment is an event", ": ping\n\ndata: a\n\n", []string{": ping\n\n", "data: a\n\n"}, io.EOF},
		{"ends after an event, no [DONE]", "data: a\n\n", []string{"data: a\n\n"}, io.EOF},
		{"ends mid-event", "data: a\n\ndata: {\"par", []string{"data: a\n\n"}, ErrTruncated},
		{"ends mid-event after a full line", "data: a\n\ndata: b\n", []string{"data: a\n\n"}, ErrTruncated},
		{"[DONE] without its blank line", "data: a\n\ndata: [DONE]", []string{"data: a\n\n", "data: [DONE]\n\n"}, io.EOF},
		{"a line past the bound", "data: a\n\ndata: " + strings.Repeat("x", 70<<10) + "\n\n", []string{"data: a\n\n"}, ErrTooLarge},
		{"an event past the bound in short lines", "data: a\n\n" + strings.Repeat("data: xxxxxxxxxx\n", 8<<10), []string{"data: a\n\n"}, ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events, err := eventsOf(tt.stream, 64<<10)
			if !errors.Is(err, tt.err) {
				t.Errorf("err = %v, want %v", err, tt.err)
			}
			if strings.Join(events, "|") != strings.Join(tt.events, "|") {
				t.Errorf("events %q, want %q", events, tt.events)
			}
		})
	}
}

// endsBlank says whether ev's last line is blank — nothing but carriage
// returns before its newline — as an event ends.
func endsBlank(ev string) bool {
	body, ok := strings.CutSuffix(ev, "\n")
	if !ok {
		return false
	}
	return strings.Trim(body[strings.LastIndexByte(body, '\n')+1:], "\r") == ""
}

// FuzzEventReader: whatever a backend sends, the reader returns whole
// events (each ends with a blank line) that are the stream's own bytes in
// order, never holds more than its bound, and ends with a known error.
func FuzzEventReader(f *testing.F) {
	for _, s := range []string{"data: a\n\ndata: [DONE]\n\n", "data: {\"x\"", ": c\r\n\r\n", "\n\n\n", "data: [DONE]", strings.Repeat("y", 300)} {
		f.Add([]byte(s))
	}
	const bound = 256
	f.Fuzz(func(t *testing.T, stream []byte) {
		events, err := eventsOf(string(stream), bound)
		if !errors.Is(err, io.EOF) && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrTooLarge) {
			t.Fatalf("unexpected error %v", err)
		}
		rest := stream
		for _, ev := range events {
			if len(ev) > bound+2 { // a completed [DONE] gains its blank line
				t.Fatalf("event of %d bytes past the bound", len(ev))
			}
			if !endsBlank(ev) {
				t.Fatalf("event %q does not end with a blank line", ev)
			}
			if isDone([]byte(ev)) && !bytes.HasPrefix(rest, []byte(ev)) {
				if i := bytes.Index(rest, bytes.TrimSpace([]byte(ev))); i < 0 {
					t.Fatalf("[DONE] %q not in the stream", ev)
				}
				return
			}
			if !bytes.HasPrefix(rest, []byte(ev)) {
				t.Fatalf("event %q is not the stream's next bytes %q", ev, rest[:min(len(rest), 40)])
			}
			rest = rest[len(ev):]
		}
	})
}

// isDone says whether ev is the stream's terminator.
func isDone(ev []byte) bool { return bytes.Equal(Data(ev), []byte("[DONE]")) }
