package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/backends/sim"
)

// openStream starts a streamed chat completion and returns once its first
// event arrived (the request admitted and running); cancel ends it.
func openStream(t *testing.T, gw, body string) (end func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gw+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		t.Fatalf("status %d", resp.StatusCode)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	return func() { cancel(); resp.Body.Close() }
}

// saltedBody is chatBody with a cache_salt.
func saltedBody(prompt string, maxTokens int, salt string) string {
	var m map[string]any
	_ = json.Unmarshal([]byte(chatBody(prompt, maxTokens, true)), &m)
	m["cache_salt"] = salt
	b, _ := json.Marshal(m)
	return string(b)
}

// On a backend with vLLM's prefix cache, running requests with one prompt
// hold its full blocks once, and the gateway counts them once; another
// cache_salt shares nothing; the blocks go when their last holder ends.
// (Wall time: the simulator runs in real time so that streams stay open
// while the test looks; nothing is asserted on how long anything takes.)
func TestASharedPromptIsCountedOnceOnItsGPU(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	s, gw := startGateway(t, baseConfig(url, ""), Options{})
	rt := s.rt.Load()
	eventually(t, "the backend's report of its prefix cache", func() bool { return rt.gpus["gpu0"].sharing.Load() })

	prompt := words(800) // ~50 full blocks
	one := openStream(t, gw, chatBody(prompt, 2000, true))
	alone := gpuStats(s, "gpu0")
	if alone.Shared == 0 || alone.SharedSaved != 0 {
		t.Fatalf("one request: shared %d, saved %d; want its blocks in the table, nothing saved", alone.Shared, alone.SharedSaved)
	}
	two := openStream(t, gw, chatBody(prompt, 2000, true))
	both := gpuStats(s, "gpu0")
	if both.Shared != alone.Shared || both.SharedSaved != alone.Shared || both.Held >= 2*alone.Held {
		t.Fatalf("two requests, one prompt: held %d (alone %d), shared %d, saved %d; want the prompt once",
			both.Held, alone.Held, both.Shared, both.SharedSaved)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kvgate_kv_shared_bytes", map[string]string{"gpu": "gpu0"}, float64(alone.Shared)},
		{"kvgate_kv_shared_saved_bytes", map[string]string{"gpu": "gpu0"}, float64(alone.Shared)},
		{"kvgate_prompt_blocks_shared_total", map[string]string{"gpu": "gpu0"}, float64(alone.PromptBlocks)},
	} {
		if got, ok := metricValue(t, s, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s = %g (present %v), want %g", c.name, got, ok, c.want)
		}
	}
	salted := openStream(t, gw, saltedBody(prompt, 2000, "tenant-b"))
	if st := gpuStats(s, "gpu0"); st.SharedSaved != both.SharedSaved || st.Shared != 2*alone.Shared {
		t.Fatalf("another cache_salt: shared %d, saved %d; want its own blocks beside, nothing more saved", st.Shared, st.SharedSaved)
	}
	one()
	eventually(t, "the first holder to be released", func() bool { return gpuStats(s, "gpu0").Tickets == 2 })
	if st := gpuStats(s, "gpu0"); st.Shared != 2*alone.Shared {
		t.Fatalf("after the first holder: shared %d; the second still holds the prompt's %d", st.Shared, alone.Shared)
	}
	two()
	salted()
	eventually(t, "every block to go", func() bool { st := gpuStats(s, "gpu0"); return st.Held == 0 && st.Shared == 0 })
}

// A backend that does not share (prefix caching off), one that the
// configuration says not to count so (prefix_caching: off), and a prompt
// the gateway only estimates get every prompt counted whole.
func TestWithoutPrefixCachingEveryPromptIsCountedWhole(t *testing.T) {
	for _, tc := range []struct {
		name      string
		simShares bool
		config    string
	}{
		{"the backend reports it off", false, ""},
		{"the configuration turns it off", true, "    prefix_caching: off\n"},
		{"the prompt is estimated", true, "estimate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1; c.DisablePrefixCaching = !tc.simShares })
			cfg := baseConfig(url, "")
			if tc.config == "estimate" { // no token ids: nothing is known to be shared
				cfg = strings.Replace(cfg, "tokenizer: backend", "tokenizer: estimate", 1)
			} else {
				cfg = strings.Replace(cfg, "    metrics: {interval: 50ms}\n", "    metrics: {interval: 50ms}\n"+tc.config, 1)
			}
			s, gw := startGateway(t, cfg, Options{})
			eventually(t, "the backend's first report", func() bool { _, _, ok := s.rt.Load().gpus["gpu0"].reported(); return ok })
			prompt := words(800)
			openStream(t, gw, chatBody(prompt, 2000, true))
			openStream(t, gw, chatBody(prompt, 2000, true))
			if st := gpuStats(s, "gpu0"); st.Shared != 0 || st.SharedSaved != 0 {
				t.Fatalf("shared %d, saved %d", st.Shared, st.SharedSaved)
			}
		})
	}
}

func TestPrefixCachingConfigIsAutoOrOff(t *testing.T) {
	cfg := strings.Replace(baseConfig("http://127.0.0.1:1", ""), "    metrics: {interval: 50ms}\n", "    metrics: {interval: 50ms}\n    prefix_caching: yes\n", 1)
	if _, err := Parse([]byte(cfg), "."); err == nil || !strings.Contains(err.Error(), `backends[0].prefix_caching: "yes" is not auto, on or off`) {
		t.Fatalf("err = %v", err)
	}
}

// A prompt's chain names its full blocks only, and differs with the model,
// the salt and any token.
func TestPromptChain(t *testing.T) {
	s := &Server{prefixSeed: maphash.MakeSeed()}
	ids := make([]uint32, 50)
	for i := range ids {
		ids[i] = uint32(i)
	}
	base := promptChain(nil, s.prefixSeed, "m", ids, 16)
	if len(base) != 3 {
		t.Fatalf("%d names for 50 tokens in blocks of 16, want 3", len(base))
	}
	for _, tc := range []struct {
		name       string
		model      string
		salt       string
		change     int // token to change, -1 none
		sameBefore int // leading names that stay equal
	}{
		{"another model", "n", "", -1, 0},
		{"a salt", "m", "s", -1, 0},
		{"a token of the second block", "m", "", 20, 1},
		{"a token past the full blocks", "m", "", 49, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := append([]uint32(nil), ids...)
			if tc.change >= 0 {
				other[tc.change]++
			}
			got := salted(s.prefixSeed, promptChain(nil, s.prefixSeed, tc.model, other, 16), tc.salt)
			for j := range base {
				if same := got[j] == base[j]; same != (j < tc.sameBefore) {
					t.Errorf("name %d equal: %v, want %v", j, same, j < tc.sameBefore)
				}
			}
		})
	}
}

// Never an under-count: over random pairs of prompts that share a leading
// part of random length, with the same or another cache_salt, the blocks
// the gateway counts as shared by the second are never more than the
// simulated vLLM's prefix cache really finds for it.
func TestSharedBlocksAreNeverMoreThanTheBackendShares(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 })
	// No hold after a hang-up: each trial ends its streams at once.
	s, gw := startGateway(t, baseConfig(url, "admission:\n  abort_hold: 0s\n"), Options{})
	rt := s.rt.Load()
	eventually(t, "the backend's report of its prefix cache", func() bool { return rt.gpus["gpu0"].sharing.Load() })
	r := rand.New(rand.NewPCG(3, 4))
	text := func(n int) string {
		w := make([]string, n)
		for i := range w {
			w[i] = fmt.Sprintf("w%d", r.IntN(5000))
		}
		return strings.Join(w, " ")
	}
	body := func(prompt, salt string) string {
		if salt == "" {
			return chatBody(prompt, 2000, true)
		}
		return saltedBody(prompt, 2000, salt)
	}
	var counted int64
	for trial := range 12 {
		base := text(200 + r.IntN(400))
		cut := func() string { return base[:r.IntN(len(base)+1)] }
		saltA, saltB := "", ""
		if r.IntN(3) == 0 {
			saltA = "a"
		}
		if r.IntN(2) == 0 {
			saltB = saltA
		} else if r.IntN(2) == 0 {
			saltB = "b"
		}
		endA := openStream(t, gw, body(cut()+" "+text(r.IntN(40)), saltA))
		before, hits := gpuStats(s, "gpu0").SharedBlocks, backend.Stats().PrefixCacheHits
		endB := openStream(t, gw, body(cut()+" "+text(r.IntN(40)), saltB))
		shared, found := gpuStats(s, "gpu0").SharedBlocks-before, backend.Stats().PrefixCacheHits-hits
		if shared*16 > found {
			t.Fatalf("trial %d: the gateway counted %d blocks shared, the backend found %d tokens in its cache", trial, shared, found)
		}
		counted += shared
		endA()
		endB()
		eventually(t, "both to be released", func() bool { return gpuStats(s, "gpu0").Tickets == 0 })
	}
	if counted == 0 {
		t.Fatal("no trial shared a block: the test tests nothing")
	}
}

// BenchmarkPromptChain names a 4096-token prompt's 256 blocks.
func BenchmarkPromptChain(b *testing.B) {
	seed := maphash.MakeSeed()
	ids := make([]uint32, 4096)
	for i := range ids {
		ids[i] = uint32(i * 7919)
	}
	dst := make([]uint64, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		dst = promptChain(dst[:0], seed, "llama-3-8b", ids, 16)
	}
}

// Requests that share a prompt's beginning share an affinity key, whatever
// follows; the user field keys a request too; other prompts key elsewhere.
func TestAffinityKeys(t *testing.T) {
	system := `{"role":"system","content":"You are a careful assistant. Answer in French."}`
	key := func(body string, kind endpoint) (uint64, string) {
		t.Helper()
		var p fastjson.Parser
		r, err := parseRequest(&p, []byte(body), kind)
		if err != nil {
			t.Fatal(err)
		}
		return r.prefix, r.user
	}
	a, _ := key(`{"model":"m","messages":[`+system+`,{"role":"user","content":"Bonjour"}]}`, chatCompletions)
	b, _ := key(`{"model":"m","messages":[`+system+`,{"role":"user","content":"Quelle heure est-il ?"}]}`, chatCompletions)
	c, _ := key(`{"model":"m","messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"Bonjour"}]}`, chatCompletions)
	if a == 0 || a != b || a == c {
		t.Fatalf("shared system prompt keys %x and %x; another %x", a, b, c)
	}
	long := make([]byte, 3*affinityPrefix)
	for i := range long {
		long[i] = 'x'
	}
	d, _ := key(`{"model":"m","prompt":"`+string(long)+`a"}`, completions)
	e, _ := key(`{"model":"m","prompt":"`+string(long)+`b"}`, completions)
	if d == 0 || d != e {
		t.Fatalf("prompts that differ only past the prefix keyed %x and %x", d, e)
	}
	if _, user := key(`{"model":"m","prompt":"hi","user":"alice"}`, completions); user != "alice" {
		t.Fatalf("user %q", user)
	}
	if k, _ := key(`{"model":"m","prompt":[1,2,3]}`, completions); k != 0 {
		t.Fatalf("token ids keyed %x", k)
	}
}
