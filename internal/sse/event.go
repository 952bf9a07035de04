package sse

import "bytes"

// Data is the payload of an event's data line(s); nil for comments and
// events without data.
func Data(ev []byte) []byte {
	var out []byte
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		line = bytes.TrimRight(line, "\r")
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			d = bytes.TrimPrefix(d, []byte(" "))
			if out != nil {
				out = append(append(append([]byte(nil), out...), '\n'), d...)
			} else {
				out = d
			}
		}
	}
	return out
}
