package gateway

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
)

// slogLine is what slog's handler (JSON or text) writes for l at t.
func slogLine(t testing.TB, json bool, at time.Time, l *accessLine) string {
	t.Helper()
	var out bytes.Buffer
	var h slog.Handler = slog.NewTextHandler(&out, nil)
	if json {
		h = slog.NewJSONHandler(&out, nil)
	}
	r := slog.NewRecord(at, slog.LevelInfo, accessMsg, 0)
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
func checkSameLine(t testing.TB, at time.Time, l *accessLine) {
	t.Helper()
	for _, json := range []bool{false, true} {
		want := slogLine(t, json, at, l)
		if got := string(appendAccessLine(nil, json, at, l)); got != want {
			t.Fatalf("json %v:\n got %s\nwant %s", json, got, want)
		}
	}
}

// The access line's own encoder writes what slog's TextHandler and
// JSONHandler write, byte for byte: the same fields, quoting, escaping,
// numbers and time, so that a reader of the log cannot tell them apart.
func TestAccessLineMatchesSlog(t *testing.T) {
	at := time.Date(2026, 12, 6, 22, 16, 36, 123456789, time.UTC)
	full := accessLine{
		id: "req-42", method: "POST", route: "/v1/chat/completions", client: "127.0.0.1:51234",
		forwardedFor: "203.0.113.7, 10.0.0.1", userAgent: "OpenAI/Python 1.99.0", tenant: "acme", model: "llama-3-8b",
		gpu: "gpu0", backend: "gpu0", upstreamAddr: "127.0.0.1:8000", retries: 1, status: 200, outcome: "ok",
		queueWaitMS: 0.125, ttftMS: 12.5, upstreamMS: 1234.567, durationMS: 1e-7, bytesIn: 512, bytesOut: 1 << 40,
		promptTokens: 4096, outputTokens: 16, kvReservedBytes: 537395200, traceID: "4bf92f3577b34da6a3ce929d0e0e4736",
	}
	odd := []string{"", "a b", "a=b", `quote"d`, `back\slash`, "tab\there", "nl\n", "ctl\x01\x7f", "ünïcødé", "\xff\xfe",
		"line\u2028sep\u2029", "nbsp\u00a0", "zero\u200bwidth", "<html>&amp;", "emoji 🦙"}
	cases := []accessLine{{}, full}
	for _, s := range odd {
		l := full
		l.id, l.userAgent, l.forwardedFor, l.reason = s, s, s, s
		cases = append(cases, l)
	}
	for _, f := range []float64{0, 1, -1, 0.001, 1e-6, 9.99e-7, 1e20, 1e21, 123456789.123, math.SmallestNonzeroFloat64} {
		l := full
		l.durationMS, l.queueWaitMS = f, -f
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
		l := accessLine{id: id, userAgent: agent, forwardedFor: xff, durationMS: d}
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
		if got, want := string(appendAddr(nil, a)), a.String(); got != want {
			t.Errorf("%#v: %q, want %q", a, got, want)
		}
	}
	a := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 51234}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = appendAddr(buf[:0], a) }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

// The buffered writer writes whole lines: when the buffer is full, once
// accessFlushEvery has passed on the gateway's clock since its first line,
// and on flush; never a part of a line, and never without a line.
func TestAccessWriter(t *testing.T) {
	clock := admissiontest.NewClock(time.Unix(0, 0))
	var out syncBuffer
	w := newAccessWriter(&out, "text", clock)
	l := accessLine{id: "a", outcome: "ok", status: 200}
	w.write(clock.Now(), &l)
	if out.String() != "" {
		t.Fatalf("written at once: %q", out.String())
	}
	clock.Advance(accessFlushEvery - time.Millisecond)
	if out.String() != "" {
		t.Fatalf("written before accessFlushEvery: %q", out.String())
	}
	clock.Advance(time.Millisecond)
	want := string(appendAccessLine(nil, false, time.Unix(0, 0), &l))
	if out.String() != want {
		t.Fatalf("after accessFlushEvery: %q, want %q", out.String(), want)
	}
	clock.Advance(time.Hour) // nothing held: nothing written
	if out.String() != want {
		t.Fatalf("an empty flush wrote %q", out.String())
	}
	// A full buffer is written without waiting, in whole lines.
	l.userAgent = strings.Repeat("x", 200)
	var lines int
	for len(out.String()) == len(want) {
		w.write(clock.Now(), &l)
		lines++
	}
	if got := out.String()[len(want):]; strings.Count(got, "\n") != lines || !strings.HasSuffix(got, "\n") {
		t.Fatalf("%d lines written as %d newlines", lines, strings.Count(got, "\n"))
	}
	w.write(clock.Now(), &l)
	w.flush()
	if n := strings.Count(out.String(), "\n"); n != lines+2 {
		t.Fatalf("%d lines after flush, want %d", n, lines+2)
	}
	// A line costs no allocation once the buffer has grown.
	if n := testing.AllocsPerRun(100, func() { w.write(clock.Now(), &l) }); n != 0 {
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
		vals = append(vals, ms(time.Duration(us)*time.Microsecond))
	}
	for _, v := range vals {
		l := accessLine{queueWaitMS: v, ttftMS: v, upstreamMS: v, durationMS: v}
		checkSameLine(t, at, &l)
	}
}
