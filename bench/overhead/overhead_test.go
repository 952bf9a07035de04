package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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
		{[]string{"--direct", "http://a:1", "--nginx", "http://a:1", "--kvgate", "http://a:1", "--kvgate-pid", "-3"}, "--kvgate-pid -3"},
		{[]string{"--direct", "http://a:1", "--nginx", "http://a:1", "--kvgate", "http://a:1", "--fasthttp-pid", "7"}, "--fasthttp-pid without --fasthttp"},
		{[]string{"floor", "--backend", "127.0.0.1:1"}, "--listen is required"},
		{[]string{"floor", "--listen", "127.0.0.1:0"}, "--backend is required"},
	} {
		var stderr bytes.Buffer
		if code := run(c.args, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", c.args, code, stderr.String(), c.want)
		}
	}
}

// startSim serves a simulated backend with a free engine on a loopback
// port until the test ends, and returns its address.
func startSim(t *testing.T) string {
	t.Helper()
	s, err := sim.New(sim.Config{TimeScale: 0, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	return ln.Addr().String()
}

// startFloor serves the floor in front of backend until the test ends, and
// returns its address.
func startFloor(t *testing.T, backend string) string {
	t.Helper()
	srv := newFloor(backend)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	return ln.Addr().String()
}

// A whole sweep, tiny, against a real simulated backend standing in for
// every target (through the floor for fasthttp): every row is printed,
// nothing fails, and the floor's columns are there exactly when it is
// measured.
func TestSweepPrintsEveryRow(t *testing.T) {
	addr := startSim(t)
	url := "http://" + addr
	floorURL := "http://" + startFloor(t, addr)
	floorColumns := []string{"fasthttp (a bare fasthttp reverse proxy, the library's floor)", "fasthttp/nginx", "kvgate/fasthttp"}
	// Every target here is served by this process: its CPU time is theirs.
	self := strconv.Itoa(os.Getpid())
	for _, c := range []struct {
		name  string
		extra []string
		floor bool
		cpu   bool
	}{
		{"without the floor", nil, false, false},
		{"with the floor", []string{"--fasthttp", floorURL}, true, false},
		{"with CPU times", []string{"--fasthttp", floorURL, "--direct-pid", self, "--nginx-pid", self, "--kvgate-pid", self, "--fasthttp-pid", self}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, stderr bytes.Buffer
			args := append([]string{"--direct", url, "--nginx", url, "--kvgate", url, "--conns", "1,2", "--miss-conns", "2",
				"--rounds", "1", "--duration", "20ms", "--warmup", "0s", "--long-tokens", "300", "--note", "versions here"}, c.extra...)
			if code := run(args, &out, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			table := out.String()
			for _, want := range []string{"machine: ", "versions here", "kvgate/nginx", "short unique", "long unique"} {
				if !strings.Contains(table, want) {
					t.Errorf("table lacks %q:\n%s", want, table)
				}
			}
			for _, col := range floorColumns {
				if strings.Contains(table, col) != c.floor {
					t.Errorf("floor measured: %v, but %q in the table: %v:\n%s", c.floor, col, !c.floor, table)
				}
			}
			table, cpu, hasCPU := strings.Cut(table, "CPU time per request")
			if hasCPU != c.cpu {
				t.Errorf("CPU measured: %v, but a CPU table: %v:\n%s", c.cpu, hasCPU, out.String())
			}
			if c.cpu {
				var rows int
				for _, l := range strings.Split(cpu, "\n") {
					if strings.HasPrefix(l, "      1  ") || strings.HasPrefix(l, "      2  ") {
						rows++
						// conns, stream, prompt, 4 servers, 2 ratios; a time
						// or "-" (no tick in a 20 ms window) in each.
						f := strings.Fields(strings.Replace(l, " unique", "_unique", 1))
						if len(f) != 3+4+2 {
							t.Errorf("CPU row has %d fields, want 9: %q", len(f), l)
							continue
						}
						for _, v := range f[3:7] {
							if v != "-" && !strings.HasSuffix(v, "s") {
								t.Errorf("CPU row %q: %q is not a time", l, v)
							}
						}
					}
				}
				if rows != 10 {
					t.Errorf("want 10 CPU rows, got %d:\n%s", rows, cpu)
				}
			}
			lines := strings.Split(table, "\n")
			var rows int
			for _, l := range lines {
				if strings.HasPrefix(l, "      1  ") || strings.HasPrefix(l, "      2  ") {
					rows++
					// conns, stream, prompt, direct's 3, 3 per proxy, 2 ratios,
					// and the floor's 2 ratios.
					want := 3 + 3 + 3*2 + 2
					if c.floor {
						want += 3 + 2
					}
					if f := strings.Fields(strings.Replace(l, " unique", "_unique", 1)); len(f) != want {
						t.Errorf("row has %d fields, want %d: %q", len(f), want, l)
					}
				}
			}
			if rows != 10 {
				t.Errorf("want 10 rows (2 conns × 2 stream × 2 prompts + 2 unique), got %d:\n%s", rows, table)
			}
		})
	}
}

// withoutIDs makes two answers of the simulator comparable: it gives every
// request an id and a creation time of its own, and nothing else differs.
var (
	idField      = regexp.MustCompile(`"id":"(chat)?cmpl-[0-9a-f]+"`)
	createdField = regexp.MustCompile(`"created":[0-9]+`)
)

func withoutIDs(b []byte) string {
	b = idField.ReplaceAll(b, []byte(`"id":"ID"`))
	return string(createdField.ReplaceAll(b, []byte(`"created":0`)))
}

// answer is what a client gets; the headers a relay may rightly change
// (Date, Server, framing) are left out.
type answer struct {
	status      int
	contentType string
	sized       bool // a Content-Length, or else chunked
	body        string
}

func post(t *testing.T, c *http.Client, addr, path, body string) answer {
	t.Helper()
	resp, err := c.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return answer{resp.StatusCode, resp.Header.Get("Content-Type"), resp.ContentLength >= 0, withoutIDs(b)}
}

// The floor relays the simulator's answers as they are: status, type,
// framing and body, streamed or not, successful or not.
func TestFloorRelaysAnswersUnchanged(t *testing.T) {
	backend := startSim(t)
	floor := startFloor(t, backend)
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	chat := func(model, prompt string, stream bool) string {
		return string(workload{model: model, prompt: prompt, maxTokens: 16, stream: stream}.body(nil, 0))
	}
	long := strings.Repeat(paragraph, 40)
	for _, tc := range []struct {
		name, path, body string
		status           int
		sized            bool
	}{
		{"non-streamed", "/v1/chat/completions", chat("llama-3-8b", shortPrompt, false), 200, true},
		{"streamed", "/v1/chat/completions", chat("llama-3-8b", shortPrompt, true), 200, false},
		{"long prompt", "/v1/chat/completions", chat("llama-3-8b", long, false), 200, true},
		{"long prompt, streamed", "/v1/chat/completions", chat("llama-3-8b", long, true), 200, false},
		{"legacy completions", "/v1/completions", `{"model":"llama-3-8b","prompt":"Say hi","max_tokens":4}`, 200, true},
		{"unknown model", "/v1/chat/completions", chat("nope", shortPrompt, false), 404, true},
		{"bad JSON", "/v1/chat/completions", `{"model":`, 400, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			direct := post(t, c, backend, tc.path, tc.body)
			if direct.status != tc.status || direct.sized != tc.sized {
				t.Fatalf("the simulator answered %d (sized: %v), the test expects %d (sized: %v): %.300s",
					direct.status, direct.sized, tc.status, tc.sized, direct.body)
			}
			if got := post(t, c, floor, tc.path, tc.body); got != direct {
				t.Errorf("through the floor:\n%+v\ndirect:\n%+v", got, direct)
			}
		})
	}
}

// A stream reaches the client event by event: the first event is read
// through the floor while the backend still holds back the rest. A floor
// that buffered the answer would hang here.
func TestFloorStreamsAsTheBackendWrites(t *testing.T) {
	const first, rest = "data: {\"n\":1}\n\n", "data: {\"n\":2}\n\ndata: [DONE]\n\n"
	gate := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Backend", "gated")
		io.WriteString(w, first)
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, rest)
	}))
	defer backend.Close()
	floor := startFloor(t, strings.TrimPrefix(backend.URL, "http://"))

	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://"+floor+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Backend") != "gated" || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, headers %v: the backend's were not relayed", resp.StatusCode, resp.Header)
	}
	r := bufio.NewReader(resp.Body)
	var got []byte
	for !bytes.HasSuffix(got, []byte("\n\n")) {
		b, err := r.ReadBytes('\n')
		got = append(got, b...)
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
	}
	if string(got) != first {
		t.Fatalf("first event %q, want %q", got, first)
	}
	close(gate)
	tail, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if string(tail) != rest {
		t.Errorf("rest of the stream %q, want %q", tail, rest)
	}
}

// A backend that cannot be reached is the proxy's failure: 502.
func TestFloorDeadBackendIs502(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://"+startFloor(t, dead)+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502", resp.StatusCode)
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

// A server's CPU time is its own and its descendants' (nginx's workers),
// read from each process's stat line, whatever its command is called.
func TestTreeCPU(t *testing.T) {
	root := t.TempDir()
	for _, p := range []struct {
		pid  int
		stat string
	}{
		{1, "1 (init) S 0 1 1 0 -1 4194560 1 0 0 0 7 3 0 0 20 0 1 0 1 0 0"},
		{10, "10 (nginx: master) S 1 10 10 0 -1 4194560 1 0 0 0 100 50 0 0 20 0 1 0 1 0 0"},
		{11, "11 (nginx: worker (a) b)) R 10 10 10 0 -1 4194560 1 0 0 0 300 200 0 0 20 0 1 0 1 0 0"},
		{12, "12 (x) S 11 10 10 0 -1 4194560 1 0 0 0 1 1 0 0 20 0 1 0 1 0 0"},
		{20, "20 (other) S 1 20 20 0 -1 4194560 1 0 0 0 999 999 0 0 20 0 1 0 1 0 0"},
	} {
		if err := os.MkdirAll(filepath.Join(root, strconv.Itoa(p.pid)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, strconv.Itoa(p.pid), "stat"), []byte(p.stat+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(root, "self"), nil, 0o644) // not a process
	got, err := treeCPU(root, 10)
	if err != nil {
		t.Fatal(err)
	}
	if want := 652 * time.Second / userHZ; got != want {
		t.Errorf("nginx's tree: %v, want %v", got, want)
	}
	if _, err := treeCPU(root, 30); err == nil {
		t.Error("a process that is not running was measured")
	}
	os.WriteFile(filepath.Join(root, "12", "stat"), []byte("12 (x) S 11 10"), 0o644)
	if _, err := treeCPU(root, 10); err == nil {
		t.Error("a short stat line was read")
	}
}
