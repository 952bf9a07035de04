package accesslog

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

// slogLine is what slog's handler (JSON or text) writes for l at t.
func slogLine(t testing.TB, json bool, at time.Time, l *Line) string {
	t.Helper()
	var out bytes.Buffer
	var h slog.Handler = slog.NewTextHandler(&out, nil)
	if json {
		h = slog.NewJSONHandler(&out, nil)
	}
	r := slog.NewRecord(at, slog.LevelInfo, Msg, 0)
	var attrs slogAttrs
	l.fields(&attrs)
	r.AddAttrs(attrs...)
	if err := h.Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// checkSameLine fails unless the access line's encoder writes l exactly as
// slog's handlers do, in both formats.
func checkSameLine(t testing.TB, at time.Time, l *Line) {
	t.Helper()
	for _, json := range []bool{false, true} {
		want := slogLine(t, json, at, l)
		if got := string(Append(nil, json, at, l)); got != want {
			t.Fatalf("json %v:\n got %s\nwant %s", json, got, want)
		}
	}
}

// The access line's own encoder writes what slog's TextHandler and
// JSONHandler write, byte for byte: the same fields, quoting, escaping,
// numbers and time, so that a reader of the log cannot tell them apart.
func TestAccessLineMatchesSlog(t *testing.T) {
	at := time.Date(2026, 12, 6, 22, 16, 36, 123456789, time.UTC)
	full := Line{
		ID: "req-42", Method: "POST", Route: "/v1/chat/completions", Client: "127.0.0.1:51234",
		ForwardedFor: "203.0.113.7, 10.0.0.1", UserAgent: "OpenAI/Python 1.99.0", Tenant: "acme", Model: "llama-3-8b",
		GPU: "gpu0", Backend: "gpu0", UpstreamAddr: "127.0.0.1:8000", Retries: 1, Status: 200, Outcome: "ok",
		QueueWaitMS: 0.125, TTFTMS: 12.5, UpstreamMS: 1234.567, DurationMS: 1e-7, BytesIn: 512, BytesOut: 1 << 40,
		PromptTokens: 4096, OutputTokens: 16, KVReservedBytes: 537395200, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
	}
	odd := []string{"", "a b", "a=b", `quote"d`, `back\slash`, "tab\there", "nl\n", "ctl\x01\x7f", "ünïcødé", "\xff\xfe",
		"line\u2028sep\u2029", "nbsp\u00a0", "zero\u200bwidth", "<html>&amp;", "emoji 🦙"}
	cases := []Line{{}, full}
	for _, s := range odd {
		l := full
		l.ID, l.UserAgent, l.ForwardedFor, l.Reason = s, s, s, s
		cases = append(cases, l)
	}
	for _, f := range []float64{0, 1, -1, 0.001, 1e-6, 9.99e-7, 1e20, 1e21, 123456789.123, math.SmallestNonzeroFloat64} {
		l := full
		l.DurationMS, l.QueueWaitMS = f, -f
		cases = append(cases, l)
	}
	for _, l := range cases {
		checkSameLine(t, at, &l)
		checkSameLine(t, at.In(time.FixedZone("x", -7*3600)), &l)
	}
}

// FuzzAccessLine holds the encoder to slog's handlers for any strings a
// client can put in a line.
func FuzzAccessLine(f *testing.F) {
	f.Add("req-1", "curl/8.0", "1.2.3.4", 1.5)
	f.Add("\x00\"\\=", "\xc3\x28 \u2028", "", 1e-9)
	f.Fuzz(func(t *testing.T, id, agent, xff string, d float64) {
		if math.IsNaN(d) || math.IsInf(d, 0) {
			return
		}
		l := Line{ID: id, UserAgent: agent, ForwardedFor: xff, DurationMS: d}
		checkSameLine(t, time.Unix(1796286500, 5e8), &l)
	})
}

// A client's address is written as its String method would, without the
// allocations.
func TestAppendAddr(t *testing.T) {
	for _, a := range []net.Addr{
		&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 51234},
		&net.TCPAddr{IP: net.ParseIP("10.1.2.3").To4(), Port: 80},
		&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 443},
		&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 8080, Zone: "eth0"},
		&net.TCPAddr{IP: nil, Port: 1},
		&net.UnixAddr{Name: "/run/kvgate.sock", Net: "unix"},
	} {
		if got, want := string(AppendAddr(nil, a)), a.String(); got != want {
			t.Errorf("%#v: %q, want %q", a, got, want)
		}
	}
	a := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 51234}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = AppendAddr(buf[:0], a) }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

// The buffered writer writes whole lines: when the buffer is full, once
// accessFlushEvery has passed on the gateway's clock since its first line,
// and on flush; never a part of a line, and never without a line.
func TestAccessWriter(t *testing.T) {
	clock := admissiontest.NewClock(time.Unix(0, 0))
	var out syncbuf.Buffer
	w := NewWriter(&out, "text", func(d time.Duration, f func()) { clock.AfterFunc(d, f) })
	l := Line{ID: "a", Outcome: "ok", Status: 200}
	w.Add(clock.Now(), &l)
	if out.String() != "" {
		t.Fatalf("written at once: %q", out.String())
	}
	clock.Advance(FlushEvery - time.Millisecond)
	if out.String() != "" {
		t.Fatalf("written before accessFlushEvery: %q", out.String())
	}
	clock.Advance(time.Millisecond)
	want := string(Append(nil, false, time.Unix(0, 0), &l))
	if out.String() != want {
		t.Fatalf("after accessFlushEvery: %q, want %q", out.String(), want)
	}
	clock.Advance(time.Hour) // nothing held: nothing written
	if out.String() != want {
		t.Fatalf("an empty flush wrote %q", out.String())
	}
	// A full buffer is written without waiting, in whole lines.
	l.UserAgent = strings.Repeat("x", 200)
	var lines int
	for len(out.String()) == len(want) {
		w.Add(clock.Now(), &l)
		lines++
	}
	if got := out.String()[len(want):]; strings.Count(got, "\n") != lines || !strings.HasSuffix(got, "\n") {
		t.Fatalf("%d lines written as %d newlines", lines, strings.Count(got, "\n"))
	}
	w.Add(clock.Now(), &l)
	w.Flush()
	if n := strings.Count(out.String(), "\n"); n != lines+2 {
		t.Fatalf("%d lines after flush, want %d", n, lines+2)
	}
	// A line costs no allocation once the buffer has grown.
	if n := testing.AllocsPerRun(100, func() { w.Add(clock.Now(), &l) }); n != 0 {
		t.Errorf("%v allocations a line", n)
	}
}

// A duration in milliseconds to the microsecond is written as slog writes
// it, whichever way the encoder takes: its own digits below 10⁶ ms,
// strconv's above, around the edges and for values that are not whole
// microseconds.
func TestAccessLineMillisAsSlog(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC)
	vals := []float64{0, 0.001, 0.01, 0.1, 0.5, 1, 1.25, 10, 99.999, 100000, 999999.999, 1e6, 1e6 + 0.001, 123456789.5, 1e21, 1e-7, 0.0004, math.Copysign(0, -1), 1.0 / 3, math.Nextafter(2, 3), -1}
	for us := int64(0); us < 3_000_000; us += 997 {
		vals = append(vals, Millis(time.Duration(us)*time.Microsecond))
	}
	for _, v := range vals {
		l := Line{QueueWaitMS: v, TTFTMS: v, UpstreamMS: v, DurationMS: v}
		checkSameLine(t, at, &l)
	}
}
