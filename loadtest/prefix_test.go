package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestBodySystemAndHistory(t *testing.T) {
	history := []Turn{{User: "u1", Assistant: "a1"}, {User: "u2", Assistant: "a2"}}
	cases := []struct {
		name       string
		chat       bool
		spec       RequestSpec
		wantMsgs   []chatMessage
		wantPrompt string
	}{
		{name: "chat alone", chat: true, spec: RequestSpec{Prompt: "p"},
			wantMsgs: []chatMessage{{"user", "p"}}},
		{name: "chat system", chat: true, spec: RequestSpec{Prompt: "p", System: "s"},
			wantMsgs: []chatMessage{{"system", "s"}, {"user", "p"}}},
		{name: "chat system and history", chat: true, spec: RequestSpec{Prompt: "p", System: "s", History: history},
			wantMsgs: []chatMessage{{"system", "s"}, {"user", "u1"}, {"assistant", "a1"}, {"user", "u2"}, {"assistant", "a2"}, {"user", "p"}}},
		{name: "chat history only", chat: true, spec: RequestSpec{Prompt: "p", History: history[:1]},
			wantMsgs: []chatMessage{{"user", "u1"}, {"assistant", "a1"}, {"user", "p"}}},
		{name: "completion alone", spec: RequestSpec{Prompt: "p"}, wantPrompt: "p"},
		{name: "completion system", spec: RequestSpec{Prompt: "p", System: "s"}, wantPrompt: "s p"},
		{name: "completion system and history", spec: RequestSpec{Prompt: "p", System: "s", History: history},
			wantPrompt: "s u1 a1 u2 a2 p"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &httpSender{model: "m", chat: tc.chat}
			raw, err := s.body(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			var b requestBody
			if err := json.Unmarshal(raw, &b); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(b.Messages, tc.wantMsgs) || b.Prompt != tc.wantPrompt {
				t.Errorf("messages %v, prompt %q; want %v, %q", b.Messages, b.Prompt, tc.wantMsgs, tc.wantPrompt)
			}
		})
	}
}

func TestSenderKeepsTextWhenAsked(t *testing.T) {
	chat := []string{
		`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"content":" world"},"finish_reason":"stop"}]}` + "\n\n",
		"data: [DONE]\n\n",
	}
	completion := []string{
		`data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"text":" b","finish_reason":"stop"}]}` + "\n\n",
	}
	cases := []struct {
		name   string
		events []string
		chat   bool
		keep   bool
		want   string
	}{
		{"chat kept", chat, true, true, "Hello world"},
		{"chat not asked", chat, true, false, ""},
		{"completion without [DONE] kept", completion, false, true, "a b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := sseServer(t, tc.events, nil)
			s := testSender(srv.URL, &stepClock{step: time.Millisecond})
			s.chat = tc.chat
			r := s.Send(context.Background(), RequestSpec{Prompt: "p", PromptTokens: 1, MaxTokens: 2, KeepText: tc.keep})
			if r.Outcome != OutcomeOK || r.Text != tc.want {
				t.Errorf("got %s %q, text %q; want ok, %q", r.Outcome, r.Err, r.Text, tc.want)
			}
		})
	}
}

func TestSenderKeepsTextOfAWholeAnswer(t *testing.T) {
	srv := httptestJSON(t, `{"choices":[{"index":0,"message":{"role":"assistant","content":"whole answer"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":2}}`)
	s := testSender(srv, &stepClock{step: time.Millisecond})
	s.stream = false
	r := s.Send(context.Background(), RequestSpec{Prompt: "p", PromptTokens: 1, MaxTokens: 2, KeepText: true})
	if r.Outcome != OutcomeOK || r.Text != "whole answer" {
		t.Errorf("got %s %q, text %q", r.Outcome, r.Err, r.Text)
	}
}

// httptestJSON serves body as every answer and returns its URL.
func httptestJSON(t *testing.T, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestSessionTurns(t *testing.T) {
	ok := func(prompt, out int, text string) Result {
		return Result{Outcome: OutcomeOK, PromptTokens: prompt, OutputTokens: out, Text: text}
	}
	type step struct {
		spec        RequestSpec // before open
		res         Result
		wantHistory []Turn
		wantPrompt  int // spec.PromptTokens after open
	}
	cases := []struct {
		name       string
		turns      int
		maxContext int
		steps      []step
	}{
		{name: "three turns then afresh", turns: 3, steps: []step{
			{RequestSpec{Prompt: "u1", PromptTokens: 110, MaxTokens: 50}, ok(112, 20, "a1"), nil, 110},
			{RequestSpec{Prompt: "u2", PromptTokens: 105, MaxTokens: 50}, ok(140, 30, "a2"), []Turn{{"u1", "a1"}}, 105 + 112 + 20 - 100},
			{RequestSpec{Prompt: "u3", PromptTokens: 101, MaxTokens: 50}, ok(175, 10, "a3"), []Turn{{"u1", "a1"}, {"u2", "a2"}}, 101 + 140 + 30 - 100},
			{RequestSpec{Prompt: "u4", PromptTokens: 120, MaxTokens: 50}, ok(121, 10, "a4"), nil, 120},
		}},
		{name: "a failure ends the session", turns: 4, steps: []step{
			{RequestSpec{Prompt: "u1", PromptTokens: 110}, ok(110, 20, "a1"), nil, 110},
			{RequestSpec{Prompt: "u2", PromptTokens: 110}, Result{Outcome: OutcomeShed}, []Turn{{"u1", "a1"}}, 140},
			{RequestSpec{Prompt: "u3", PromptTokens: 110}, ok(110, 20, "a3"), nil, 110},
		}},
		{name: "a turn past the context starts afresh", turns: 4, maxContext: 400, steps: []step{
			{RequestSpec{Prompt: "u1", PromptTokens: 110, MaxTokens: 100}, ok(110, 100, "a1"), nil, 110},
			{RequestSpec{Prompt: "u2", PromptTokens: 110, MaxTokens: 100}, ok(220, 100, "a2"), []Turn{{"u1", "a1"}}, 220},
			{RequestSpec{Prompt: "u3", PromptTokens: 110, MaxTokens: 100}, ok(110, 100, "a3"), nil, 110},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var s session
			for i, st := range tc.steps {
				spec := st.spec
				s.open(&spec, tc.maxContext)
				if !reflect.DeepEqual(spec.History, st.wantHistory) || spec.PromptTokens != st.wantPrompt || !spec.KeepText {
					t.Errorf("turn %d: history %v, prompt %d, keep %v; want %v, %d", i, spec.History, spec.PromptTokens, spec.KeepText, st.wantHistory, st.wantPrompt)
				}
				res := st.res
				s.close(spec, &res, tc.turns, 100)
				if res.Text != "" {
					t.Errorf("turn %d: text %q left in the result", i, res.Text)
				}
			}
		})
	}
}

func TestClosedLoopSessionsResendTheAnswers(t *testing.T) {
	// Each answer names its request; each worker's sessions must carry the
	// answers it got, in order, and restart after three turns.
	var mu sync.Mutex
	got := map[int]RequestSpec{}
	send := func(_ context.Context, spec RequestSpec) Result {
		mu.Lock()
		got[spec.Index] = spec
		mu.Unlock()
		now := time.Now()
		return Result{Index: spec.Index, Outcome: OutcomeOK, Start: now, FirstToken: now, End: now,
			Text: fmt.Sprintf("answer %d", spec.Index), PromptTokens: spec.PromptTokens, OutputTokens: 1}
	}
	spec := func(i int) RequestSpec {
		return RequestSpec{Index: i, Prompt: fmt.Sprintf("user %d", i), PromptTokens: 10, MaxTokens: 1}
	}
	a := runAttempt(context.Background(), SystemClock{}, senderFunc(send), spec, stepConfig{Mode: ModeConcurrency, Level: 3, Requests: 27, Warmup: 3, Turns: 3})
	if len(a.results) != 27 {
		t.Fatalf("%d counted, want 27", len(a.results))
	}
	for _, r := range a.results {
		if r.Text != "" {
			t.Errorf("request %d kept its text", r.Index)
		}
	}
	// Every request's history is a chain of earlier requests of its
	// session, each answered with its own index.
	starts := 0
	for i, s := range got {
		if len(s.History) == 0 {
			starts++
		}
		if len(s.History) > 2 {
			t.Errorf("request %d has %d earlier turns, want at most 2", i, len(s.History))
		}
		for _, turn := range s.History {
			var j int
			if _, err := fmt.Sscanf(turn.User, "user %d", &j); err != nil || turn.Assistant != fmt.Sprintf("answer %d", j) || j >= i {
				t.Errorf("request %d: turn %+v is not an earlier request and its answer", i, turn)
			}
		}
		// Each earlier turn adds its user message and its one-token answer.
		if want := 10 + 11*len(s.History); s.PromptTokens != want || !s.KeepText {
			t.Errorf("request %d: prompt %d tokens, keep %v; want %d", i, s.PromptTokens, s.KeepText, want)
		}
	}
	// 30 requests in sessions of at most three turns, each of the three
	// workers ending with at most one session cut short.
	if starts < 30/3 || starts > 30/3+3 {
		t.Errorf("%d sessions started, want 10 to 13", starts)
	}
}

func TestClosedLoopSessionsOpenWithTheirContext(t *testing.T) {
	// A session's first turn comes from Opening, the later ones from the
	// workload, whose history then starts with the opening's message.
	var mu sync.Mutex
	var got []RequestSpec
	send := func(_ context.Context, spec RequestSpec) Result {
		mu.Lock()
		got = append(got, spec)
		mu.Unlock()
		now := time.Now()
		return Result{Index: spec.Index, Outcome: OutcomeOK, Start: now, FirstToken: now, End: now,
			Text: "a", PromptTokens: spec.PromptTokens, OutputTokens: 1}
	}
	turn := func(i int) RequestSpec {
		return RequestSpec{Index: i, Prompt: fmt.Sprintf("turn %d", i), PromptTokens: 10, MaxTokens: 1}
	}
	opening := func(i int) RequestSpec {
		return RequestSpec{Index: i, Prompt: fmt.Sprintf("context %d", i), PromptTokens: 1000, MaxTokens: 1}
	}
	runAttempt(context.Background(), SystemClock{}, senderFunc(send), turn,
		stepConfig{Mode: ModeConcurrency, Level: 2, Requests: 12, Turns: 3, Opening: opening})
	if len(got) != 12 {
		t.Fatalf("%d sent, want 12", len(got))
	}
	for _, s := range got {
		first := len(s.History) == 0
		if first != strings.HasPrefix(s.Prompt, "context") {
			t.Errorf("request %d (%d earlier turns) sent %q", s.Index, len(s.History), s.Prompt)
		}
		if !first && (!strings.HasPrefix(s.History[0].User, "context") || s.PromptTokens != 10+1000+1+11*(len(s.History)-1)) {
			t.Errorf("request %d: history %+v, prompt %d tokens", s.Index, s.History, s.PromptTokens)
		}
	}
}

func TestWorkloadOpeningDrawsTheSessionContext(t *testing.T) {
	gen := estimatedPromptGen()
	c := Config{Seed: 3, PromptTokens: fixed(100), OutputTokens: fixed(50), SharedPrefixTokens: 300, Turns: 4}
	if s := newWorkload(c, gen, 0, 1, 7).opening(0); s.PromptTokens != 400 {
		t.Errorf("no session context: opening of %d tokens, want 400", s.PromptTokens)
	}
	c.SessionContextTokens = fixed(5000)
	w := newWorkload(c, gen, 0, 1, 7)
	if s := w.opening(0); s.PromptTokens != 5300 || s.System != w.prefix {
		t.Errorf("opening of %d tokens (system %v), want 5300 after the shared prefix", s.PromptTokens, s.System == w.prefix)
	}
	if s := w.spec(0); s.PromptTokens != 400 {
		t.Errorf("later turn of %d tokens, want 400", s.PromptTokens)
	}
}

type senderFunc func(ctx context.Context, spec RequestSpec) Result

func (f senderFunc) Send(ctx context.Context, spec RequestSpec) Result { return f(ctx, spec) }

func TestWorkloadSharedPrefix(t *testing.T) {
	gen := estimatedPromptGen()
	c := Config{Seed: 3, PromptTokens: fixed(100), OutputTokens: fixed(50), SharedPrefixTokens: 300}
	cases := []struct {
		name       string
		other      workload
		samePrefix bool
	}{
		{"same step", newWorkload(c, gen, 0, 1, 7), true},
		{"next attempt", newWorkload(c, gen, 0, 2, 7), false},
		{"other level or target", newWorkload(c, gen, 0, 1, 8), false},
	}
	w := newWorkload(c, gen, 0, 1, 7)
	if n := len(strings.Fields(w.prefix)); n < 290 || n > 300 {
		t.Errorf("prefix of %d words, want about 300 tokens", n)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := w.spec(0), tc.other.spec(1)
			if (a.System == b.System) != tc.samePrefix {
				t.Errorf("prefixes equal = %v, want %v", a.System == b.System, tc.samePrefix)
			}
			if a.Prompt == b.Prompt {
				t.Errorf("two requests share their own part %q", a.Prompt)
			}
			if a.PromptTokens != 400 || a.MaxTokens != 50 {
				t.Errorf("prompt %d, max tokens %d; want 400 (shared included), 50", a.PromptTokens, a.MaxTokens)
			}
		})
	}
	// Without a shared prefix nothing opens the request.
	c.SharedPrefixTokens = 0
	if s := newWorkload(c, gen, 0, 1, 7).spec(0); s.System != "" || s.PromptTokens != 100 {
		t.Errorf("no shared prefix: system %q, prompt %d", s.System, s.PromptTokens)
	}
	// The context bounds the request's own part and its output, past the
	// shared prefix.
	c.SharedPrefixTokens = 300
	if s := newWorkload(c, gen, 360, 1, 7).spec(0); s.PromptTokens+s.MaxTokens != 360 {
		t.Errorf("context 360: prompt %d + output %d", s.PromptTokens, s.MaxTokens)
	}
}

func TestConfigSharedPrefixAndTurns(t *testing.T) {
	base := func() Config { return Config{Targets: []Target{{URL: "http://h:1"}}} }
	cases := []struct {
		name    string
		edit    func(*Config)
		wantErr string
	}{
		{"both", func(c *Config) { c.SharedPrefixTokens, c.Turns = 2048, 4 }, ""},
		{"negative prefix", func(c *Config) { c.SharedPrefixTokens = -1 }, "SharedPrefixTokens"},
		{"huge prefix", func(c *Config) { c.SharedPrefixTokens = 1 << 30 }, "SharedPrefixTokens"},
		{"negative turns", func(c *Config) { c.Turns = -1 }, "Turns"},
		{"turns in an open loop", func(c *Config) { c.Turns, c.Rates = 3, []float64{1} }, "Turns"},
		{"one turn in an open loop", func(c *Config) { c.Turns, c.Rates = 1, []float64{1} }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.edit(&c)
			_, err := c.withDefaults()
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want one naming %q", err, tc.wantErr)
			}
		})
	}
}

// pauseClock is the wall clock whose After fires at once and notes how long
// it was asked to wait.
type pauseClock struct {
	SystemClock
	mu     sync.Mutex
	pauses []time.Duration
}

func (c *pauseClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	c.pauses = append(c.pauses, d)
	c.mu.Unlock()
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

func TestClosedLoopSessionsThinkBetweenTurns(t *testing.T) {
	const turns = 3
	// Which worker takes which request is up to the scheduler, so how many
	// sessions end in full is too: count the turns that are not a
	// session's last, each of which must be followed by a pause.
	var notLast atomic.Int64
	send := func(_ context.Context, spec RequestSpec) Result {
		if len(spec.History)+1 < turns {
			notLast.Add(1)
		}
		now := time.Now()
		return Result{Index: spec.Index, Outcome: OutcomeOK, Start: now, FirstToken: now, End: now, Text: "a", PromptTokens: spec.PromptTokens, OutputTokens: 1}
	}
	spec := func(i int) RequestSpec { return RequestSpec{Index: i, Prompt: "q", PromptTokens: 10, MaxTokens: 1} }
	clock := &pauseClock{}
	// Two workers, 12 requests in sessions of 3: a pause after each first
	// and second turn, none after a session's last.
	runAttempt(context.Background(), clock, senderFunc(send), spec,
		stepConfig{Mode: ModeConcurrency, Level: 2, Requests: 12, Turns: turns, Think: time.Second})
	// 6+6 requests end four sessions (8 pauses); 7+5 or 8+4 end three (9).
	if n := int64(len(clock.pauses)); n != notLast.Load() || n < 8 || n > 9 {
		t.Fatalf("%d pauses after %d turns that were not a session's last, want one after each (8 or 9)", n, notLast.Load())
	}
	distinct := map[time.Duration]bool{}
	for _, d := range clock.pauses {
		if d < 500*time.Millisecond || d >= 1500*time.Millisecond {
			t.Errorf("a pause of %s, want between half and 1.5× the mean", d)
		}
		distinct[d] = true
	}
	if len(distinct) < 2 {
		t.Errorf("pauses %v, want them drawn", clock.pauses)
	}
}
