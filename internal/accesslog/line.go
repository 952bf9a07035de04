package accesslog

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
)

// Line is one access line's values, in the order they are written.
type Line struct {
	ID, Method, Route, Client, ForwardedFor, UserAgent string
	Tenant, Model, GPU, Backend, UpstreamAddr          string
	Retries, Status                                    int
	Outcome, Reason                                    string
	QueueWaitMS, TTFTMS, UpstreamMS, DurationMS        float64
	BytesIn                                            int
	BytesOut                                           int64
	PromptTokens, OutputTokens                         int
	KVReservedBytes                                    int64
	TraceID                                            string
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
func (l *Line) fields(f fieldSink) {
	f.str("id", l.ID)
	f.str("method", l.Method)
	f.str("route", l.Route)
	f.str("client", l.Client)
	f.str("x_forwarded_for", l.ForwardedFor)
	f.str("user_agent", l.UserAgent)
	f.str("tenant", l.Tenant)
	f.str("model", l.Model)
	f.str("gpu", l.GPU)
	f.str("backend", l.Backend)
	f.str("upstream_addr", l.UpstreamAddr)
	f.num("retries", int64(l.Retries))
	f.num("status", int64(l.Status))
	f.str("outcome", l.Outcome)
	f.str("reason", l.Reason)
	f.float("queue_wait_ms", l.QueueWaitMS)
	f.float("ttft_ms", l.TTFTMS)
	f.float("upstream_ms", l.UpstreamMS)
	f.float("duration_ms", l.DurationMS)
	f.num("bytes_in", int64(l.BytesIn))
	f.num("bytes_out", l.BytesOut)
	f.num("prompt_tokens", int64(l.PromptTokens))
	f.num("output_tokens", int64(l.OutputTokens))
	f.num("kv_reserved_bytes", l.KVReservedBytes)
	f.str("trace_id", l.TraceID)
}

// Msg is the access line's message.
const Msg = "request"

// Attrs is the line as slog attributes, for a logger's own handler where
// no Writer is set up.
func (l *Line) Attrs() []slog.Attr {
	attrs := make(slogAttrs, 0, 25)
	l.fields(&attrs)
	return attrs
}

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
		e.buf = append(e.buf, `","level":"INFO","msg":"`+Msg+`"`...)
		return
	}
	e.buf = append(e.buf, "time="...)
	e.buf = appendRFC3339Millis(e.buf, t)
	e.buf = append(e.buf, " level=INFO msg="+Msg...)
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
func (e *lineEncoder) line(t time.Time, l *Line) {
	e.begin(t)
	l.fields(e)
	e.end()
}

// Append appends l as one line written at t.
func Append(buf []byte, json bool, t time.Time, l *Line) []byte {
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

// AppendAddr appends a client's address as its String method writes it,
// without allocating for a TCP address.
func AppendAddr(b []byte, a net.Addr) []byte {
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

// FlushBytes and FlushEvery bound how long a line waits in the
// access log's buffer: written when the buffer holds 32 KiB, or 100 ms
// after the first line it holds, or when the server shuts down.
const (
	FlushBytes = 32 << 10
	FlushEvery = 100 * time.Millisecond
)

// Writer buffers access lines for an io.Writer: whole lines only, so
// that they interleave with the logger's other lines line by line.
type Writer struct {
	out   io.Writer
	after func(d time.Duration, f func()) // the clock's AfterFunc, which the flush waits on

	mu sync.Mutex // guards below
	// enc holds the buffer (enc.buf); it lives here, not on the stack,
	// because the line's fields reach it through an interface.
	enc   lineEncoder
	armed bool // a flush is scheduled
}

// NewWriter writes lines to out in the logger's format ("text" or
// "json"), a buffer's worth at a time or FlushEvery after a line, as
// after (a clock's AfterFunc) counts it.
func NewWriter(out io.Writer, format string, after func(d time.Duration, f func())) *Writer {
	return &Writer{out: out, after: after, enc: lineEncoder{json: format == "json", buf: make([]byte, 0, FlushBytes+4096)}}
}

// Add appends l's line, written at t.
func (w *Writer) Add(t time.Time, l *Line) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.enc.line(t, l)
	switch {
	case len(w.enc.buf) >= FlushBytes:
		w.flushLocked()
	case !w.armed:
		w.armed = true
		w.after(FlushEvery, w.tick)
	}
}

func (w *Writer) tick() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
	w.flushLocked()
}

// Flush writes what the buffer holds.
func (w *Writer) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked()
}

func (w *Writer) flushLocked() {
	if len(w.enc.buf) == 0 {
		return
	}
	_, _ = w.out.Write(w.enc.buf) // as slog's handlers: a log that cannot be written is not the request's failure
	w.enc.buf = w.enc.buf[:0]
}

// Millis is d in the line's milliseconds, to the microsecond.
func Millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
