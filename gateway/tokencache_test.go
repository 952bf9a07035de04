package gateway

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/backends/sim"
	dto "github.com/prometheus/client_model/go"
)

// order lists the cache's keys' first words from most to least recently
// used, checking the links both ways and the index on the way.
func (c *tokenCache) order(t *testing.T) []uint64 {
	t.Helper()
	var fwd, back []uint64
	for i := c.head; i >= 0; i = c.slots[i].next {
		fwd = append(fwd, c.slots[i].key[0])
		if len(fwd) > len(c.slots) {
			t.Fatal("cycle in the recency list")
		}
	}
	for i := c.tail; i >= 0; i = c.slots[i].prev {
		back = append(back, c.slots[i].key[0])
		if len(back) > len(c.slots) {
			t.Fatal("cycle in the recency list")
		}
	}
	slices.Reverse(back)
	if !slices.Equal(fwd, back) || len(fwd) != len(c.slots) || len(c.index) != len(c.slots) {
		t.Fatalf("list %v, backwards %v, %d slots, %d indexed", fwd, back, len(c.slots), len(c.index))
	}
	for k, i := range c.index {
		if c.slots[i].key != k {
			t.Fatalf("index points %v at slot %d holding %v", k, i, c.slots[i].key)
		}
	}
	return fwd
}

func TestTokenCacheLRU(t *testing.T) {
	k := func(n uint64) tokenKey { return tokenKey{n, ^n} }
	type step struct {
		op    string // put, get, forget
		key   uint64
		count int
		hit   bool     // for get
		order []uint64 // after the step, most recent first
	}
	for _, tc := range []struct {
		name  string
		cap   int
		steps []step
	}{
		{"evicts the least recently used", 3, []step{
			{op: "put", key: 1, count: 10, order: []uint64{1}},
			{op: "put", key: 2, count: 20, order: []uint64{2, 1}},
			{op: "put", key: 3, count: 30, order: []uint64{3, 2, 1}},
			{op: "get", key: 1, count: 10, hit: true, order: []uint64{1, 3, 2}},
			{op: "put", key: 4, count: 40, order: []uint64{4, 1, 3}},
			{op: "get", key: 2, hit: false, order: []uint64{4, 1, 3}},
			{op: "put", key: 3, count: 31, order: []uint64{3, 4, 1}},
			{op: "get", key: 3, count: 31, hit: true, order: []uint64{3, 4, 1}},
		}},
		{"forget keeps the slots dense", 4, []step{
			{op: "put", key: 1, count: 10}, {op: "put", key: 2, count: 20}, {op: "put", key: 3, count: 30},
			{op: "forget", key: 1, count: 10, order: []uint64{3, 2}}, // slot 0 refilled by the last
			{op: "forget", key: 3, count: 99, order: []uint64{3, 2}}, // another count: kept
			{op: "forget", key: 3, count: 30, order: []uint64{2}},    // the head
			{op: "forget", key: 2, count: 20, order: nil},            // the only one
			{op: "put", key: 5, count: 50, order: []uint64{5}},       // works from empty again
			{op: "get", key: 5, count: 50, hit: true, order: []uint64{5}},
		}},
		{"capacity one", 1, []step{
			{op: "put", key: 1, count: 1, order: []uint64{1}},
			{op: "put", key: 2, count: 2, order: []uint64{2}},
			{op: "get", key: 1, hit: false, order: []uint64{2}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTokenCache(tc.cap)
			for i, s := range tc.steps {
				switch s.op {
				case "put":
					c.put(k(s.key), s.count)
				case "get":
					n, ok := c.get(k(s.key))
					if ok != s.hit || (ok && n != s.count) {
						t.Fatalf("step %d: get(%d) = %d, %v; want %d, %v", i, s.key, n, ok, s.count, s.hit)
					}
				case "forget":
					c.forget(k(s.key), s.count)
				}
				if got := c.order(t); s.order != nil && !slices.Equal(got, s.order) || s.order == nil && s.op == "forget" && len(got) != 0 {
					t.Fatalf("step %d (%s %d): order %v, want %v", i, s.op, s.key, got, s.order)
				}
			}
		})
	}
}

// A random mix of operations agrees with a plain reference model: a map
// and a recency list.
func TestTokenCacheMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const capacity = 16
	c := newTokenCache(capacity)
	ref := map[uint64]int{}
	var recency []uint64 // most recent first
	touch := func(key uint64) {
		recency = slices.DeleteFunc(recency, func(x uint64) bool { return x == key })
		recency = slices.Insert(recency, 0, key)
	}
	for i := range 20000 {
		key := uint64(r.IntN(40))
		k := tokenKey{key, 0}
		switch op := r.IntN(10); {
		case op < 5:
			n, ok := c.get(k)
			want, wok := ref[key]
			if ok != wok || n != want {
				t.Fatalf("op %d: get(%d) = %d, %v; want %d, %v", i, key, n, ok, want, wok)
			}
			if ok {
				touch(key)
			}
		case op < 9:
			n := r.IntN(1000)
			c.put(k, n)
			if _, ok := ref[key]; !ok && len(ref) == capacity {
				last := recency[len(recency)-1]
				delete(ref, last)
				recency = recency[:len(recency)-1]
			}
			ref[key] = n
			touch(key)
		default:
			if n, ok := ref[key]; ok {
				c.forget(k, n)
				delete(ref, key)
				recency = slices.DeleteFunc(recency, func(x uint64) bool { return x == key })
			}
		}
		if got := c.order(t); !slices.Equal(got, recency) {
			t.Fatalf("op %d: order %v, want %v", i, got, recency)
		}
	}
	if c.hits.Load()+c.misses.Load() == 0 || c.stale.Load() == 0 {
		t.Fatal("the mix never hit, missed and forgot")
	}
}

func metricValue(t *testing.T, s *Server, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := s.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

// A prompt seen before is counted from the cache, without asking the
// backend: hits and misses show in the metrics and /status, and the
// prediction error is labelled by where the count came from.
func TestTokenizeCacheHits(t *testing.T) {
	// A backend that shares no prompt blocks: what is counted here is the
	// cache's counts alone, never a chain asked for (prefix_test.go).
	_, url := startSim(t, func(c *sim.Config) { c.DisablePrefixCaching = true })
	s, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	body := chatBody("How large is a KV block?", 4, false)
	for i := range 3 {
		if res := postJSON(gwURL, "/v1/chat/completions", body); res.status != 200 {
			t.Fatalf("request %d: %d %s", i, res.status, res.body)
		}
	}
	if res := postJSON(gwURL, "/v1/chat/completions", chatBody("Another prompt entirely.", 4, false)); res.status != 200 {
		t.Fatalf("%d %s", res.status, res.body)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kvgate_tokenize_cache_lookups_total", map[string]string{"model": "llama-3-8b", "result": "hit"}, 2},
		{"kvgate_tokenize_cache_lookups_total", map[string]string{"model": "llama-3-8b", "result": "miss"}, 2},
		{"kvgate_tokenize_cache_entries", map[string]string{"model": "llama-3-8b"}, 2},
		{"kvgate_tokenize_cache_stale_total", map[string]string{"model": "llama-3-8b"}, 0},
		// Cached counts are the backend's own: their error is none.
		{"kvgate_prompt_tokens_actual_over_predicted", map[string]string{"model": "llama-3-8b", "tokenizer": "cache"}, 2},
		{"kvgate_prompt_tokens_actual_over_predicted", map[string]string{"model": "llama-3-8b", "tokenizer": "backend"}, 2},
	} {
		if got, ok := metricValue(t, s, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %g (present %v), want %g", c.name, c.labels, got, ok, c.want)
		}
	}
	res, err := httpClient.Get(gwURL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var st statusView
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if tc := st.ModelInfo[0].TokenizeCache; tc == nil || tc.Hits != 2 || tc.Misses != 2 || tc.HitRate != 0.5 || tc.Capacity != defaultTokenizeCache {
		t.Errorf("status tokenize_cache = %+v", tc)
	}
}

// A cached count that the backend's usage contradicts (its tokenizer
// changed under the same model name) is dropped; the next request asks the
// backend again.
func TestTokenizeCacheDropsStaleCounts(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.DisablePrefixCaching = true })
	s, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	body := chatBody("How large is a KV block?", 4, false)
	if res := postJSON(gwURL, "/v1/chat/completions", body); res.status != 200 {
		t.Fatalf("%d %s", res.status, res.body)
	}
	c := s.rt.Load().models["llama-3-8b"].tokens
	k := c.slots[c.head].key
	c.put(k, c.slots[c.head].count+7) // as if an older tokenizer had counted it
	if res := postJSON(gwURL, "/v1/chat/completions", body); res.status != 200 {
		t.Fatalf("%d %s", res.status, res.body)
	}
	if c.stale.Load() != 1 || c.len() != 0 {
		t.Fatalf("stale %d, entries %d; want the contradicted entry dropped", c.stale.Load(), c.len())
	}
	if res := postJSON(gwURL, "/v1/chat/completions", body); res.status != 200 {
		t.Fatalf("%d %s", res.status, res.body)
	}
	if c.misses.Load() != 2 || c.hits.Load() != 1 || c.len() != 1 {
		t.Errorf("after the drop: %d misses, %d hits, %d entries; want 2, 1, 1", c.misses.Load(), c.hits.Load(), c.len())
	}
}

// tokenize_cache: default, off, too large; a reload with the same size
// keeps what the cache has learnt.
func TestTokenizeCacheConfig(t *testing.T) {
	for _, c := range []struct {
		line    string
		entries int // 0: no cache
		err     string
	}{
		{"", defaultTokenizeCache, ""},
		{"tokenize_cache: 10", 10, ""},
		{"tokenize_cache: -1", 0, ""},
		{fmt.Sprintf("tokenize_cache: %d", maxTokenizeCache+1), 0, "models[0].tokenize_cache"},
	} {
		cfg := strings.Replace(baseConfig("http://127.0.0.1:1", ""), "tokenizer: backend", "tokenizer: backend\n    "+c.line, 1)
		parsed, err := Parse([]byte(cfg), ".")
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want one naming %s", c.line, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", c.line, err)
		}
		s, err := New(parsed, Options{DisableProbes: true})
		if err != nil {
			t.Fatal(err)
		}
		tc := s.rt.Load().models["llama-3-8b"].tokens
		if (tc == nil) != (c.entries == 0) || tc != nil && tc.capacity != c.entries {
			t.Errorf("%q: cache %+v, want %d entries", c.line, tc, c.entries)
		}
		if tc != nil {
			again, _ := Parse([]byte(cfg), ".")
			if err := s.Reload(again); err != nil {
				t.Fatal(err)
			}
			if s.rt.Load().models["llama-3-8b"].tokens != tc {
				t.Errorf("%q: a reload with the same cache size replaced the cache", c.line)
			}
		}
		s.watch.Close()
	}
	estimate := strings.Replace(baseConfig("http://127.0.0.1:1", ""), "tokenizer: backend", "tokenizer: estimate", 1)
	parsed, err := Parse([]byte(estimate), ".")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(parsed, Options{DisableProbes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.watch.Close()
	if s.rt.Load().models["llama-3-8b"].tokens != nil {
		t.Error("the estimate tokenizer has no /tokenize answers to cache")
	}
}

// Concurrent lookups, inserts and drops leave a consistent cache (run with
// -race).
func TestTokenCacheConcurrent(t *testing.T) {
	c := newTokenCache(64)
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 5000 {
				k := tokenKey{uint64(r.IntN(100)), 1}
				switch r.IntN(3) {
				case 0:
					c.get(k)
				case 1:
					c.put(k, int(k[0]))
				default:
					c.forget(k, int(k[0]))
				}
			}
		}()
	}
	for range 8 {
		<-done
	}
	c.order(t)
	for _, s := range c.slots {
		if s.count != int(s.key[0]) {
			t.Fatalf("slot %v holds count %d", s.key, s.count)
		}
	}
}

// Chains are kept beside counts within their bound, the least recently
// used dropped first; an entry that lost its chain is a miss to a caller
// after one, unless its prompt has no block to share.
func TestTokenizeCacheKeepsChainsWithinTheirBound(t *testing.T) {
	c := newTokenCache(2) // 128 names in all
	chain := func(n int) []uint64 { return make([]uint64, n) }
	a, b := tokenKey{1}, tokenKey{2}
	c.putChain(a, 1000, chain(60))
	c.putChain(b, 1000, chain(60))
	if c.names != 120 {
		t.Fatalf("%d names kept, want 120", c.names)
	}
	if _, ch, ok := c.lookup(a, 16); !ok || len(ch) != 60 {
		t.Fatalf("a: ok %v, %d names; want its chain", ok, len(ch))
	}
	c.putChain(b, 1000, chain(70)) // a is the more recent: b's old chain goes first, then a's
	if c.names != 70 {
		t.Fatalf("%d names kept, want b's 70 alone", c.names)
	}
	if _, _, ok := c.lookup(a, 16); ok {
		t.Error("a, without its chain, answered a caller after one")
	}
	if n, _, ok := c.lookup(a, 0); !ok || n != 1000 {
		t.Errorf("a's count: %d, %v; want 1000 for a caller after the count alone", n, ok)
	}
	c.putChain(tokenKey{3}, 10, nil) // a prompt of less than a block: nothing to share
	if _, _, ok := c.lookup(tokenKey{3}, 16); !ok {
		t.Error("a prompt too short to share anything missed for want of a chain")
	}
	c.putChain(tokenKey{4}, 5000, chain(200)) // over the whole bound: the count alone
	if _, ch, ok := c.lookup(tokenKey{4}, 0); !ok || ch != nil {
		t.Errorf("a chain over the bound kept: %v, %d names", ok, len(ch))
	}
	c.forget(b, 1000)
	if c.names > c.maxNames || c.names < 0 {
		t.Errorf("%d names counted after forget (bound %d)", c.names, c.maxNames)
	}
}
