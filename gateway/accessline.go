package gateway

import (
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kvgate/kvgate/admission"
)

// The access line's encoding. A line is written, by default, straight into
// a buffered writer in the format of the gateway's logger (log.format),
// byte for byte what slog's TextHandler or JSONHandler would write for the
// same record (TestAccessLineMatchesSlog holds it to that), but without a
// record, an attribute slice or a write per line: a proxy that logs every
// request pays for the line as nginx does, not more. Without such a writer
// (Options.AccessLog nil) the line goes through the logger's handler.

// accessLine is one access line's values, in the order they are written.
type accessLine struct {
	id, method, route, client, forwardedFor, userAgent string
	tenant, model, gpu, backend, upstreamAddr          string
	retries, status                                    int
	outcome, reason                                    string
	queueWaitMS, ttftMS, upstreamMS, durationMS        float64
	bytesIn                                            int
	bytesOut                                           int64
	promptTokens, outputTokens                         int
	kvReservedBytes                                    int64
	traceID                                            string
}

// fieldSink takes a line's fields one by one: an encoder, or the slog
// attributes of the fallback.
type fieldSink interface {
	str(key, v string)
	num(key string, v int64)
	float(key string, v float64)
}

// fields gives the line's fields to f, in the line's order: the one place
// that order and the keys are written down.
func (l *accessLine) fields(f fieldSink) {
	f.str("id", l.id)
	f.str("method", l.method)
	f.str("route", l.route)
	f.str("client", l.client)
	f.str("x_forwarded_for", l.forwardedFor)
	f.str("user_agent", l.userAgent)
	f.str("tenant", l.tenant)
	f.str("model", l.model)
	f.str("gpu", l.gpu)
	f.str("backend", l.backend)
	f.str("upstream_addr", l.upstreamAddr)
	f.num("retries", int64(l.retries))
	f.num("status", int64(l.status))
	f.str("outcome", l.outcome)
	f.str("reason", l.reason)
	f.float("queue_wait_ms", l.queueWaitMS)
	f.float("ttft_ms", l.ttftMS)
	f.float("upstream_ms", l.upstreamMS)
	f.float("duration_ms", l.durationMS)
	f.num("bytes_in", int64(l.bytesIn))
	f.num("bytes_out", l.bytesOut)
	f.num("prompt_tokens", int64(l.promptTokens))
	f.num("output_tokens", int64(l.outputTokens))
	f.num("kv_reserved_bytes", l.kvReservedBytes)
	f.str("trace_id", l.traceID)
}

// accessMsg is the access line's message.
const accessMsg = "request"

// slogAttrs is the fallback's sink: the fields as slog attributes, the
// strings copied (the record's views into the exchange's buffer are given
// back after the line; a handler may keep what it is given).
type slogAttrs []slog.Attr

func (a *slogAttrs) str(key, v string) { *a = append(*a, slog.String(key, strings.Clone(v))) }
func (a *slogAttrs) num(key string, v int64) {
	*a = append(*a, slog.Int64(key, v))
}
func (a *slogAttrs) float(key string, v float64) { *a = append(*a, slog.Float64(key, v)) }

// lineEncoder appends fields to buf as slog's TextHandler (json false) or
// JSONHandler writes them.
type lineEncoder struct {
	buf  []byte
	json bool
}

// begin writes the line's time, level and message.
func (e *lineEncoder) begin(t time.Time) {
	if e.json {
		e.buf = append(e.buf, `{"time":"`...)
		e.buf = t.AppendFormat(e.buf, time.RFC3339Nano)
		e.buf = append(e.buf, `","level":"INFO","msg":"`+accessMsg+`"`...)
		return
	}
	e.buf = append(e.buf, "time="...)
	e.buf = appendRFC3339Millis(e.buf, t)
	e.buf = append(e.buf, " level=INFO msg="+accessMsg...)
}

// end closes the line.
func (e *lineEncoder) end() {
	if e.json {
		e.buf = append(e.buf, '}')
	}
	e.buf = append(e.buf, '\n')
}

func (e *lineEncoder) key(k string) {
	if e.json {
		e.buf = append(e.buf, ',', '"')
		e.buf = append(e.buf, k...)
		e.buf = append(e.buf, '"', ':')
		return
	}
	e.buf = append(e.buf, ' ')
	e.buf = append(e.buf, k...)
	e.buf = append(e.buf, '=')
}

func (e *lineEncoder) str(k, v string) {
	e.key(k)
	switch {
	case e.json:
		e.buf = append(e.buf, '"')
		e.buf = appendJSONEscaped(e.buf, v)
		e.buf = append(e.buf, '"')
	case textNeedsQuoting(v):
		e.buf = strconv.AppendQuote(e.buf, v)
	default:
		e.buf = append(e.buf, v...)
	}
}

func (e *lineEncoder) num(k string, v int64) {
	e.key(k)
	e.buf = strconv.AppendInt(e.buf, v, 10)
}

func (e *lineEncoder) float(k string, v float64) {
	e.key(k)
	if b, ok := appendMillis(e.buf, v); ok {
		e.buf = b
		return
	}
	if e.json {
		e.buf = appendJSONFloat(e.buf, v)
		return
	}
	e.buf = strconv.AppendFloat(e.buf, v, 'g', -1, 64)
}

// line appends l as one line written at t.
func (e *lineEncoder) line(t time.Time, l *accessLine) {
	e.begin(t)
	l.fields(e)
	e.end()
}

// appendAccessLine appends l as one line written at t.
func appendAccessLine(buf []byte, json bool, t time.Time, l *accessLine) []byte {
	e := lineEncoder{buf: buf, json: json}
	e.line(t, l)
	return e.buf
}

// appendRFC3339Millis is slog's text time: RFC 3339 to the millisecond,
// always three digits.
func appendRFC3339Millis(b []byte, t time.Time) []byte {
	const prefixLen = len("2006-01-02T15:04:05.000")
	n := len(b)
	t = t.Truncate(time.Millisecond).Add(time.Millisecond / 10)
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b[:n+prefixLen], b[n+prefixLen+1:]...) // drop the 4th digit
}

// jsonSafe holds, for each ASCII byte, whether it goes into a JSON string
// as it is: all but the control characters, '"' and '\\' (slog's and
// encoding/json's safeSet).
var jsonSafe = func() (t [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// textNeedsQuoting is slog's TextHandler rule: a value is quoted when it
// is empty, or holds a space, '=', a character JSON would escape (but a
// lone backslash), invalid UTF-8, or a non-printing or space rune.
func textNeedsQuoting(s string) bool {
	if len(s) == 0 {
		return true
	}
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b != '\\' && (b == ' ' || b == '=' || !jsonSafe[b]) {
				return true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return true
		}
		i += size
	}
	return false
}

// appendJSONEscaped is slog's JSON string body: control characters,
// quotes and backslashes escaped, invalid UTF-8 as \ufffd, U+2028 and
// U+2029 escaped.
func appendJSONEscaped(buf []byte, s string) []byte {
	const hex = "0123456789abcdef"
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if jsonSafe[b] {
				i++
				continue
			}
			buf = append(buf, s[start:i]...)
			buf = append(buf, '\\')
			switch b {
			case '\\', '"':
				buf = append(buf, b)
			case '\n':
				buf = append(buf, 'n')
			case '\r':
				buf = append(buf, 'r')
			case '\t':
				buf = append(buf, 't')
			default:
				buf = append(buf, 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			buf = append(buf, s[start:i]...)
			buf = append(buf, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			buf = append(buf, s[start:i]...)
			buf = append(buf, `\u202`...)
			buf = append(buf, hex[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(buf, s[start:]...)
}

// appendJSONFloat is encoding/json's float64 (which slog's JSONHandler
// calls): 'f' format, 'e' below 1e-6 or from 1e21, its exponent without a
// leading zero. The access line's values are finite.
func appendJSONFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// appendMillis appends v, a count of milliseconds to the microsecond
// (ms), as both of slog's handlers write it, without strconv's search for
// the shortest digits: below 10⁶ a whole number of microseconds over a
// thousand is written with its three decimals, trailing zeros cut, which
// is what the shortest form of such a value is, in 'f' and 'g' alike. ok
// is false for any other value, which strconv writes.
func appendMillis(b []byte, v float64) (_ []byte, ok bool) {
	if !(v >= 0 && v < 1e6) || math.Signbit(v) { // -0 is written "-0"
		return b, false
	}
	us := int64(math.Round(v * 1000))
	if float64(us)/1000 != v {
		return b, false
	}
	b = strconv.AppendInt(b, us/1000, 10)
	frac := us % 1000
	if frac == 0 {
		return b, true
	}
	digits := [3]byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
	n := 3
	for digits[n-1] == '0' {
		n--
	}
	b = append(b, '.')
	return append(b, digits[:n]...), true
}

// appendAddr appends a client's address as its String method writes it,
// without allocating for a TCP address.
func appendAddr(b []byte, a net.Addr) []byte {
	t, ok := a.(*net.TCPAddr)
	if !ok {
		if a == nil {
			return b
		}
		return append(b, a.String()...)
	}
	ip, ok := netip.AddrFromSlice(t.IP)
	if !ok {
		return append(b, t.String()...)
	}
	ip = ip.Unmap()
	if t.Zone != "" {
		ip = ip.WithZone(t.Zone)
	}
	return netip.AddrPortFrom(ip, uint16(t.Port)).AppendTo(b)
}

// accessFlushBytes and accessFlushEvery bound how long a line waits in the
// access log's buffer: written when the buffer holds 32 KiB, or 100 ms
// after the first line it holds, or when the server shuts down.
const (
	accessFlushBytes = 32 << 10
	accessFlushEvery = 100 * time.Millisecond
)

// accessWriter buffers access lines for an io.Writer: whole lines only, so
// that they interleave with the logger's other lines line by line.
type accessWriter struct {
	out   io.Writer
	clock admission.Clock

	mu sync.Mutex // guards below
	// enc holds the buffer (enc.buf); it lives here, not on the stack,
	// because the line's fields reach it through an interface.
	enc   lineEncoder
	armed bool // a flush is scheduled
}

func newAccessWriter(out io.Writer, format string, clock admission.Clock) *accessWriter {
	return &accessWriter{out: out, clock: clock, enc: lineEncoder{json: format == "json", buf: make([]byte, 0, accessFlushBytes+4096)}}
}

// write appends l's line, written at t.
func (w *accessWriter) write(t time.Time, l *accessLine) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.enc.line(t, l)
	switch {
	case len(w.enc.buf) >= accessFlushBytes:
		w.flushLocked()
	case !w.armed:
		w.armed = true
		w.clock.AfterFunc(accessFlushEvery, w.tick)
	}
}

func (w *accessWriter) tick() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
	w.flushLocked()
}

// flush writes what the buffer holds.
func (w *accessWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked()
}

func (w *accessWriter) flushLocked() {
	if len(w.enc.buf) == 0 {
		return
	}
	_, _ = w.out.Write(w.enc.buf) // as slog's handlers: a log that cannot be written is not the request's failure
	w.enc.buf = w.enc.buf[:0]
}
