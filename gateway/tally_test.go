package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/backends/sim"
)

func TestTextBytes(t *testing.T) {
	for _, tc := range []struct {
		escaped string
		want    int
	}{
		{``, 0},
		{`abc`, 3},
		{`a\nb`, 3},
		{`\"\\\/`, 3},
		{`\u00e9`, 2},             // é
		{`é`, 2},                  // as UTF-8 bytes
		{`\u4e2d\u6587`, 6},       // 中文
		{`\ud83d\ude00`, 4},       // 😀 as a surrogate pair
		{`\ud83d`, 3},             // a lone surrogate: U+FFFD
		{`x\u00zz`, 2},            // a broken escape (never valid JSON): one byte
		{`\u0041\u0042\u0043`, 3}, // ASCII escaped
	} {
		if got := textBytes([]byte(tc.escaped)); got != tc.want {
			t.Errorf("textBytes(%s) = %d, want %d", tc.escaped, got, tc.want)
		}
	}
}

func TestCutUsage(t *testing.T) {
	for _, tc := range []struct {
		data, cut  string
		completion int
		ok         bool
	}{
		{`{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`,
			`{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}]}`, 7, true},
		{`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":12,"prompt_tokens_details":{"cached_tokens":0}} }`,
			`{"choices":[] }`, 12, true},
		{`{"choices":[{"index":0}],"usage":null}`, "", 0, false},
		{`{"usage":{"completion_tokens":1},"choices":[{"index":0}]}`, "", 0, false}, // not last: the parse reads it
		{`{"choices":[{"index":0}],"usage":{"prompt_tokens":3}}`, "", 0, false},
		{`{"choices":[{"index":0}],"usage":{"completion_tokens":-1}}`, "", 0, false},
		{`{"choices":[{"index":0,"text":",\"usage\":{\"completion_tokens\":5}}"}]}`, "", 0, false}, // inside a string
	} {
		cut, n, ok := cutUsage([]byte(tc.data), nil)
		if ok != tc.ok || ok && (string(cut) != tc.cut || n != tc.completion) {
			t.Errorf("cutUsage(%s) = %s, %d, %v; want %s, %d, %v", tc.data, cut, n, ok, tc.cut, tc.completion, tc.ok)
		}
	}
}

// A choice's count: the backend's report where it gives one, else its
// events, or its bytes once its backend is known to merge events; never
// below the events seen.
func TestChoiceCount(t *testing.T) {
	type ev struct{ bytes, reported int }
	for _, tc := range []struct {
		name    string
		events  []ev
		byBytes bool
		want    int
	}{
		{"one token an event", []ev{{4, -1}, {3, -1}, {5, -1}}, false, 3},
		{"bytes once merging is known", []ev{{4, -1}, {3, -1}, {5, -1}}, true, 12},
		{"reported wins over bytes", []ev{{4, 2}, {3, 4}, {5, 6}}, true, 6},
		{"reported on a chunk with no text", []ev{{4, 2}, {0, 9}}, false, 9},
		{"never below the events", []ev{{4, 0}, {3, 0}}, false, 2},
		{"a report never goes back", []ev{{4, 5}, {3, 3}}, false, 5},
	} {
		var c choiceCount
		got := 0
		for _, e := range tc.events {
			got = c.note(e.bytes, e.reported, tc.byBytes)
		}
		if got != tc.want {
			t.Errorf("%s: count %d, want %d", tc.name, got, tc.want)
		}
	}
	// An event's worth ahead: the backend may be that far past the count
	// when the next event comes.
	var c choiceCount
	for _, r := range []int{16, 32, 40} {
		c.note(20, r, false)
	}
	if c.ahead() != 15 {
		t.Errorf("16 tokens an event: ahead %d, want 15", c.ahead())
	}
	// The check of a final usage: more tokens than events, past the end
	// of sequence token that shows no text.
	for _, tc := range []struct {
		counts     []choiceCount
		completion int
		short      bool
	}{
		{[]choiceCount{{events: 10}}, 11, false},
		{[]choiceCount{{events: 10}}, 12, true},
		{[]choiceCount{{events: 10}, {events: 10}}, 22, false},
		{[]choiceCount{{events: 10, hasReport: true, reported: 40}}, 40, false},
	} {
		if got := eventsShort(tc.counts, tc.completion); got != tc.short {
			t.Errorf("eventsShort(%+v, %d) = %v, want %v", tc.counts, tc.completion, got, tc.short)
		}
	}
}

// scriptedStream is a fake vLLM whose chat streams are scripted by the
// test: each request takes the next script, whose events it sends one by
// one, and an empty event means "wait until the test says go on".
type scriptedStream struct {
	scripts chan []string
	bodies  chan string
	goOn    chan struct{}
}

func startScripted(t *testing.T) (*scriptedStream, string) {
	s := &scriptedStream{scripts: make(chan []string, 4), bodies: make(chan string, 4), goOn: make(chan struct{})}
	f := startFake(t, func(w http.ResponseWriter, r *http.Request, quit <-chan struct{}) {
		if tokenize3(w, r) {
			return
		}
		b, _ := io.ReadAll(r.Body)
		s.bodies <- string(b)
		script := <-s.scripts
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range script {
			if ev == "" {
				select {
				case <-s.goOn:
				case <-quit:
					return
				}
				continue
			}
			fmt.Fprintf(w, "data: %s\n\n", ev)
			w.(http.Flusher).Flush()
		}
	})
	return s, f.URL
}

// chunk is a chat chunk of vLLM's with content (nil: the role chunk), a
// finish reason ("": none) and, when usage >= 0, the cumulative usage
// continuous_usage_stats puts on every chunk.
func chunk(content *string, finish string, usage int) string {
	delta := `{"role":"assistant","content":""}`
	if content != nil {
		delta = fmt.Sprintf(`{"content":%q}`, *content)
	}
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	c := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"llama-3-8b","choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":` + fr + `}]`
	if usage >= 0 {
		c += fmt.Sprintf(`,"usage":{"prompt_tokens":3,"total_tokens":%d,"completion_tokens":%d}`, 3+usage, usage)
	}
	return c + "}"
}

func finalUsage(completion int) string {
	return fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"llama-3-8b","choices":[],"usage":{"prompt_tokens":3,"total_tokens":%d,"completion_tokens":%d}}`, 3+completion, completion)
}

func ptr(s string) *string { return &s }

// Continuous usage moves the count: the gateway asks for it, counts the
// tokens each chunk reports (here 200 behind one event), and the client's
// stream stays as the client asked for it.
func TestContinuousUsageMovesTheCount(t *testing.T) {
	for _, tc := range []struct {
		name, options string
		// usages is how many "usage" members the client sees: none, the
		// final one, or every chunk's and the final one.
		usages int
	}{
		{"not asked", ``, 0},
		{"include_usage", `,"stream_options":{"include_usage":true}`, 1},
		{"continuous_usage_stats", `,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be, url := startScripted(t)
			gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
			be.scripts <- []string{chunk(nil, "", 0), chunk(ptr("hello"), "", 200), "",
				chunk(ptr(" world"), "", 201), chunk(ptr(""), "stop", 202), finalUsage(202), "[DONE]"}
			got := make(chan result, 1)
			go func() {
				got <- postJSON(gwURL, "/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":1000,"stream":true`+tc.options+`}`)
			}()
			if body := <-be.bodies; !strings.Contains(body, `"include_usage":true`) || !strings.Contains(body, `"continuous_usage_stats":true`) {
				t.Fatalf("the backend was sent %s", body)
			}
			// One event, 200 tokens: the guard counts what the backend
			// holds, not the events.
			eventually(t, "the count reported", func() bool { return onlyGPU(gw).Now >= blocksOf(3+200) },
				func() string { return fmt.Sprintf("%+v", onlyGPU(gw)) })
			be.goOn <- struct{}{}
			r := <-got
			if r.err != nil || r.status != 200 || !strings.Contains(r.body, "hello") || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
				t.Fatalf("%v %d %s", r.err, r.status, r.body)
			}
			if n := strings.Count(r.body, `"usage"`); n != tc.usages {
				t.Fatalf("the client saw %d usages, want %d:\n%s", n, tc.usages, r.body)
			}
			if tc.usages == 0 && strings.Contains(r.body, `"choices":[]`) {
				t.Fatalf("the usage chunk reached a client that did not ask for it:\n%s", r.body)
			}
			eventually(t, "every reservation back", func() bool { return held(gw) == 0 })
		})
	}
}

// A backend that sends several tokens an event and no usage on its chunks
// (a lagging server, --stream-interval, another vLLM-like server) is found
// out by its first final usage above the events counted, and counted by
// bytes of text from then on, which no tokenizer's count passes.
func TestMergedEventsDetectedAndBoundedByBytes(t *testing.T) {
	be, url := startScripted(t)
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	stream := func(script []string, during func()) result {
		got := make(chan result, 1)
		go func() {
			got <- postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 1000, true))
		}()
		<-be.bodies
		be.scripts <- script
		if during != nil {
			during()
			be.goOn <- struct{}{}
		}
		r := <-got
		if r.err != nil || r.status != 200 || !strings.HasSuffix(r.body, "data: [DONE]\n\n") || strings.Contains(r.body, "usage") {
			t.Fatalf("%v %d %s", r.err, r.status, r.body)
		}
		return r
	}
	long := strings.Repeat("abcd", 100) // 400 bytes: 100 tokens of 4 bytes, say
	// Before anything shows it, an event is a token.
	stream([]string{chunk(nil, "", -1), chunk(ptr(long), "", -1), "", chunk(ptr(long), "stop", -1), finalUsage(200), "[DONE]"}, func() {
		eventually(t, "the first event counted", func() bool { return onlyGPU(gw).Now > 0 })
		if now := onlyGPU(gw).Now; now >= blocksOf(3+400) {
			t.Errorf("counted %d bytes of KV for one event before any merging was seen", now)
		}
	})
	if n := mergedEvents(gw); n != 1 {
		t.Fatalf("merges found %g times, want 1", n)
	}
	// From then on, bytes: 400 of them cannot be fewer than 400 tokens'
	// worth of the answer.
	stream([]string{chunk(nil, "", -1), chunk(ptr(long), "", -1), "", chunk(ptr("x"), "stop", -1), finalUsage(101), "[DONE]"}, func() {
		eventually(t, "the bytes counted", func() bool { return onlyGPU(gw).Now >= blocksOf(3+400) },
			func() string { return fmt.Sprintf("%+v", onlyGPU(gw)) })
	})
	if n := mergedEvents(gw); n != 1 {
		t.Fatalf("merges found %g times, want still 1", n)
	}
	eventually(t, "every reservation back", func() bool { return held(gw) == 0 })
}

// A backend that refuses vLLM's continuous_usage_stats (OpenAI's API, a
// proxy validating against it) answers every stream 400 while the gateway
// asks for it; with stream_usage: final it is asked for the final usage
// alone, and streams are answered whole, counted by events, then by bytes
// once the final usage shows events carrying several tokens.
func TestStreamUsageFinal(t *testing.T) {
	for _, tc := range []struct {
		name, backend string
		status        int
	}{
		{"asked for usage on every chunk", "", 400},
		{"stream_usage: final", "    stream_usage: final\n", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, url := startSim(t, func(c *sim.Config) { c.RefuseContinuousUsage, c.StreamInterval, c.TimeScale = true, 4, 0 })
			if tc.backend != "" {
				url += " 24GiB\n" + tc.backend
			}
			gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
			for i := range 3 {
				r := postJSON(gwURL, "/v1/chat/completions", chatBody(words(20), 40, true))
				if r.status != tc.status {
					t.Fatalf("request %d: %d %.300s, want %d", i, r.status, r.body, tc.status)
				}
				if tc.status != 200 {
					if !strings.Contains(r.body, "continuous_usage_stats") {
						t.Fatalf("the backend's refusal does not name what it refused: %.300s", r.body)
					}
					continue
				}
				if !strings.Contains(r.body, "[DONE]") || strings.Contains(r.body, `"usage":{`) {
					t.Fatalf("request %d: not one whole stream without the usage it did not ask for: %.300s", i, r.body)
				}
			}
			if tc.status == 200 && mergedEvents(gw) < 1 {
				t.Fatalf("events of 4 tokens not found by the final usage")
			}
			eventually(t, "every reservation back", func() bool { return held(gw) == 0 })
		})
	}
}

func mergedEvents(s *Server) float64 {
	var m dto.Metric
	if err := s.m.mergedEvents.WithLabelValues("llama-3-8b", "gpu0").Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// The shift of TestGuardResumesStoppedStreams on a backend whose events
// carry several tokens: counted by the usage on each chunk where the
// backend gives it, or by bytes once a final usage has shown the events
// short, the guard still stops streams before the backend runs out, and
// every answer is whole.
func TestGuardHoldsWhenEventsCarrySeveralTokens(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mut     func(*sim.Config)
		backend string // more keys of the backend's config
	}{
		{"4 an event, usage on every chunk", func(c *sim.Config) { c.StreamInterval = 4 }, ""},
		{"up to 16 an event, no usage on chunks", func(c *sim.Config) { c.StreamMerge, c.NoContinuousUsage = 16, true }, ""},
		{"up to 16 an event, a backend that refuses continuous usage", func(c *sim.Config) { c.StreamMerge, c.RefuseContinuousUsage = 16, true },
			"    stream_usage: final\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			backend, pool, gw, gwURL := taughtShortAnswersOver(t, tc.backend, "", tc.mut)
			body := `{"model":"llama-3-8b","messages":[{"role":"user","content":"LONG` + words(50) + `"}],"max_tokens":500,"stream":true,"stream_options":{"include_usage":true}}`
			for i, r := range wholeStreams(t, gwURL, body, 30) {
				// Usage is the backend's count of one exchange, never past
				// the client's max_tokens, however the events were merged.
				if u := usageOf(t, r.body); u[1] < 1 || u[1] > 500 {
					t.Errorf("request %d: usage completion %d, want 1..500 (max_tokens)", i, u[1])
				}
			}
			st := backend.Stats()
			as := gw.rt.Load().sched.Stats()
			t.Logf("the guard stopped %d streams; the backend's peak %d of %d blocks; merges found %g", as.GuardStops, st.PeakUsedBlocks, pool, mergedEvents(gw))
			if st.OOMEvents != 0 {
				t.Fatalf("the backend overflowed %d times", st.OOMEvents)
			}
			eventually(t, "every reservation back", func() bool { return held(gw) == 0 })
		})
	}
}

// usageAtEnd, where it answers, finds what the whole chunk's search
// finds, reading the trailing usage object alone.
func TestUsageAtEnd(t *testing.T) {
	for _, tc := range []struct {
		data string
		at   bool // found from the end
	}{
		{`{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`, true},
		{`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":12,"prompt_tokens_details":{"cached_tokens":0}} }`, true},
		{`{"choices":[{"index":0}],"usage" : {"completion_tokens":1}}`, false}, // not the key's bytes: neither finds it
		{`{"choices":[{"index":0}],"usage":null}`, false},
		{`{"usage":{"completion_tokens":1},"choices":[{"index":0}]}`, false},
		{`{"choices":[],"usage":{"completion_tokens":1,"x":{"a\"b":1}}}`, false}, // an escaped quote: searched whole
		{`{"choices":[],"usage":{"x":{"y":1},"usage":{"completion_tokens":2}}}`, false},
		{`{"choices":[{"index":0,"text":",\"usage\":{\"completion_tokens\":5}}"}]}`, false},
	} {
		got := usageAtEnd([]byte(tc.data))
		if want := bytes.LastIndex([]byte(tc.data), usageKey); (got >= 0) != tc.at || got >= 0 && got != want {
			t.Errorf("usageAtEnd(%s) = %d, want %d (found from the end: %v)", tc.data, got, want, tc.at)
		}
	}
}

// FuzzCutUsage holds the search from the end to the whole chunk's: where
// it answers, the same index.
func FuzzCutUsage(f *testing.F) {
	f.Add([]byte(`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":12,"prompt_tokens_details":{"cached_tokens":0}}}`))
	f.Add([]byte(`{"choices":[{"index":0,"text":",\"usage\":{\"completion_tokens\":5}}"}],"usage":{"completion_tokens":1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if got := usageAtEnd(data); got >= 0 && got != bytes.LastIndex(data, usageKey) {
			t.Fatalf("usageAtEnd(%q) = %d, LastIndex %d", data, got, bytes.LastIndex(data, usageKey))
		}
	})
}
