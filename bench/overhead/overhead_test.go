package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/kvgate/kvgate/backends/sim"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	for _, c := range []struct {
		d    []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 0.5, 0},
		{ms(7), 0.99, 7 * time.Millisecond},
		{ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 0.5, 5 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 0.99, 10 * time.Millisecond},
	} {
		if got := percentile(c.d, c.p); got != c.want {
			t.Errorf("percentile(%v, %g) = %v, want %v", c.d, c.p, got, c.want)
		}
	}
}

func TestFormatting(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{85 * time.Microsecond, "85µs"}, {-40 * time.Microsecond, "-40µs"}, {1250 * time.Microsecond, "1.25ms"},
		{42300 * time.Microsecond, "42.3ms"}, {1500 * time.Millisecond, "1.50s"},
	} {
		if got := fmtDur(c.d); got != c.want {
			t.Errorf("fmtDur(%v) = %q, want %q", c.d, got, c.want)
		}
	}
	for _, c := range []struct {
		a, b float64
		want string
	}{{3, 2, "1.50×"}, {1, 0, "-"}, {1, -5, "-"}} {
		if got := ratio(c.a, c.b); got != c.want {
			t.Errorf("ratio(%g, %g) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
}

func TestWorkloadBodyIsValidJSON(t *testing.T) {
	for _, w := range []workload{
		{model: "m", prompt: "hi there", maxTokens: 16},
		{model: "m", prompt: paragraph, maxTokens: 1, stream: true, unique: true},
	} {
		b := w.body(nil, 42)
		var v struct {
			Model    string
			Messages []struct{ Content string }
			Stream   bool
		}
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if v.Model != "m" || v.Stream != w.stream || !strings.HasSuffix(v.Messages[0].Content, w.prompt) {
			t.Errorf("body %s does not carry %+v", b, w)
		}
		if w.unique && !strings.HasPrefix(v.Messages[0].Content, "42 ") {
			t.Errorf("unique body %s is not numbered", b)
		}
	}
}

func TestFitPrompt(t *testing.T) {
	p := strings.Repeat(" word", 100) // 500 bytes
	if got := fitPrompt(p, 100, 50); len(got) > 250 || len(got) < 240 || strings.HasSuffix(got, " ") {
		t.Errorf("fitPrompt to half gave %d bytes: %q", len(got), got)
	}
	if got := fitPrompt(p, 100, 200); got != p {
		t.Errorf("a prompt shorter than wanted must stay whole")
	}
}

func TestReadTail(t *testing.T) {
	in := strings.Repeat("x", 10000) + "data: [DONE]\n\n"
	got, err := readTail(iotest.OneByteReader(strings.NewReader(in)), len(doneEvent))
	if err != nil || !bytes.Equal(got, doneEvent) {
		t.Errorf("readTail = %q, %v", got, err)
	}
	if _, err := readTail(iotest.ErrReader(errors.New("boom")), 4); err == nil {
		t.Error("a read error must be reported")
	}
}

func TestFlagsAreChecked(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nginx", "http://a:1", "--kvgate", "http://a:1"}, "--direct is required"},
		{[]string{"--direct", "http://a:1", "--nginx", "http://a:1", "--kvgate", "http://a:1", "--conns", "1,x"}, "--conns"},
		{[]string{"--direct", "http://a:1", "--nginx", "http://a:1", "--kvgate", "http://a:1", "--rounds", "0"}, "--rounds"},
	} {
		var stderr bytes.Buffer
		if code := run(c.args, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", c.args, code, stderr.String(), c.want)
		}
	}
}

// A whole sweep, tiny, against a real simulated backend standing in for all
// three targets: every row is printed and nothing fails.
func TestSweepPrintsEveryRow(t *testing.T) {
	s, err := sim.New(sim.Config{TimeScale: 0, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Shutdown(context.Background())
	url := "http://" + ln.Addr().String()

	var out, stderr bytes.Buffer
	code := run([]string{"--direct", url, "--nginx", url, "--kvgate", url, "--conns", "1,2", "--miss-conns", "2",
		"--rounds", "1", "--duration", "20ms", "--warmup", "0s", "--long-tokens", "300", "--note", "versions here"}, &out, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	table := out.String()
	for _, want := range []string{"machine: ", "versions here", "kvgate/nginx", "short unique", "long unique"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if rows := strings.Count(table, "\n      1  ") + strings.Count(table, "\n      2  "); rows != 10 {
		t.Errorf("want 10 rows (2 conns × 2 stream × 2 prompts + 2 unique), got %d:\n%s", rows, table)
	}
}

// An unreachable target fails the run instead of printing a partial table.
func TestUnreachableTargetFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	var out, stderr bytes.Buffer
	if code := run([]string{"--direct", url, "--nginx", url, "--kvgate", url, "--ready-timeout", "0s"}, &out, &stderr); code != 1 || out.Len() != 0 {
		t.Errorf("exit %d, stdout %q; want 1 and nothing printed", code, out.String())
	}
}
