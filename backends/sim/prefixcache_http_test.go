package sim

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func tokenIDs(t *testing.T, base string, body map[string]any) []int {
	t.Helper()
	b, _ := json.Marshal(body)
	code, out := post(t, base+"/tokenize", string(b))
	if code != 200 {
		t.Fatalf("tokenize: %d %s", code, out)
	}
	var r struct{ Tokens []int }
	unmarshal(t, out, &r)
	return r.Tokens
}

func generated(t *testing.T, base, path string, body map[string]any) (text string, promptTokens int) {
	t.Helper()
	b, _ := json.Marshal(body)
	code, out := post(t, base+path, string(b))
	if code != 200 {
		t.Fatalf("%s: %d %s", path, code, out)
	}
	var r fullJSON
	unmarshal(t, out, &r)
	if r.Choices[0].Message != nil {
		return r.Choices[0].Message.Content, r.Usage.PromptTokens
	}
	return *r.Choices[0].Text, r.Usage.PromptTokens
}

// A conversation's next turn, which sends its history as the prompt, finds
// the blocks of the previous turn's prompt and of what it generated: the
// simulator's output is tokens of its own tokenizer that tokenize back to
// themselves, so the next prompt's tokens are the history's, exactly.
func TestPrefixCacheNextTurnFindsItsHistory(t *testing.T) {
	const out = 40
	system := strings.Repeat("You are a helpful assistant who answers in full sentences. ", 4)
	tests := []struct {
		name string
		path string
		// turn builds a request body from the history so far; history is
		// nil for the first turn.
		turn func(history *string) map[string]any
		// tokenize builds the /tokenize body of the same prompt.
		tokenize func(body map[string]any) map[string]any
	}{
		{
			name: "chat", path: "/v1/chat/completions",
			turn: func(history *string) map[string]any {
				msgs := []map[string]any{{"role": "system", "content": system}, {"role": "user", "content": "Tell me a story."}}
				if history != nil {
					msgs = append(msgs, map[string]any{"role": "assistant", "content": *history},
						map[string]any{"role": "user", "content": "And then?"})
				}
				return map[string]any{"model": "llama-3-8b", "messages": msgs, "max_tokens": out, "ignore_eos": true}
			},
			tokenize: func(b map[string]any) map[string]any { return map[string]any{"messages": b["messages"]} },
		},
		{
			name: "completions", path: "/v1/completions",
			turn: func(history *string) map[string]any {
				p := system + "Once upon a time"
				if history != nil {
					p += *history + " The end."
				}
				return map[string]any{"model": "llama-3-8b", "prompt": p, "max_tokens": out, "ignore_eos": true}
			},
			tokenize: func(b map[string]any) map[string]any { return map[string]any{"prompt": b["prompt"]} },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, base := startServer(t, Config{})
			first := tc.turn(nil)
			text, p1 := generated(t, base, tc.path, first)
			if st := s.Stats(); st.PrefixCacheHits != 0 || st.PrefixCacheQueries != int64(p1) {
				t.Fatalf("first turn: %+v", st)
			}
			second := tc.turn(&text)
			// The history's tokens are a prefix of the next prompt's.
			history := append(tokenIDs(t, base, tc.tokenize(first)),
				tokenIDs(t, base, map[string]any{"prompt": text, "add_special_tokens": false})...)
			next := tokenIDs(t, base, tc.tokenize(second))
			if len(history) != p1+out || len(next) <= len(history) || !slices.Equal(next[:len(history)], history) {
				t.Fatalf("the next prompt's tokens do not start with the history's (%d prompt + %d output tokens)", p1, out)
			}
			_, p2 := generated(t, base, tc.path, second)
			want := int64((p1 + out) / 16 * 16)
			st := s.Stats()
			if st.PrefixCacheHits != want || st.PrefixCacheQueries != int64(p1+p2) {
				t.Fatalf("next turn: hits %d of %d queried; want %d of %d", st.PrefixCacheHits, st.PrefixCacheQueries, want, p1+p2)
			}
			// Both turns have ended: their blocks are cached, and free.
			m := scrape(t, base)
			lbl := `{engine="0",model_name="llama-3-8b"}`
			if st.CachedIdleBlocks == 0 || m["vllm:kv_cache_usage_perc"+lbl] != 0 || m["kvsim_kv_cache_used_blocks"+lbl] != 0 {
				t.Errorf("%d blocks cached idle, usage %g, used blocks %g; want idle blocks not counted as used",
					st.CachedIdleBlocks, m["vllm:kv_cache_usage_perc"+lbl], m["kvsim_kv_cache_used_blocks"+lbl])
			}
			if m["vllm:prefix_cache_queries_total"+lbl] != float64(p1+p2) || m["vllm:prefix_cache_hits_total"+lbl] != float64(want) {
				t.Errorf("/metrics: queries %g, hits %g; want %d, %d", m["vllm:prefix_cache_queries_total"+lbl], m["vllm:prefix_cache_hits_total"+lbl], p1+p2, want)
			}
		})
	}
}

// cache_salt is checked as vLLM checks it, isolates the cache of each salt
// and changes nothing of the output.
func TestPrefixCacheSaltOverHTTP(t *testing.T) {
	_, base := startServer(t, poolConfig(64))
	for _, bad := range []string{`""`, `5`, `["a"]`} {
		code, b := post(t, base+"/v1/completions", `{"model":"llama-3-8b","prompt":"hi","cache_salt":`+bad+`}`)
		if msg := checkErrorBody(t, code, b, 400, "BadRequestError"); !strings.Contains(msg, "'cache_salt' must be a non-empty string") {
			t.Errorf("cache_salt %s: %s", bad, msg)
		}
	}
	prompt := strings.Repeat("The same long prompt for every tenant. ", 5)
	tests := []struct {
		salt    any
		wantHit bool
	}{{nil, false}, {"tenant-a", false}, {"tenant-a", true}, {"tenant-b", false}, {nil, true}, {"tenant-b", true}}
	var text string
	var hits int64
	s, base := startServer(t, poolConfig(64))
	for i, tc := range tests {
		body := map[string]any{"model": "llama-3-8b", "prompt": prompt, "max_tokens": 3, "cache_salt": tc.salt}
		got, _ := generated(t, base, "/v1/completions", body)
		if i == 0 {
			text = got
		} else if got != text {
			t.Errorf("salt %v changed the output: %q, want %q", tc.salt, got, text)
		}
		h := s.Stats().PrefixCacheHits
		if (h > hits) != tc.wantHit {
			t.Errorf("request %d (salt %v): found %d tokens, want a hit %t", i, tc.salt, h-hits, tc.wantHit)
		}
		hits = h
	}
}

// HidePrefixCachingLabel leaves enable_prefix_caching out of
// vllm:cache_config_info and nothing else: the blocks are still shared,
// and the hit counters still count them, in tokens of whole blocks.
func TestHidePrefixCachingLabel(t *testing.T) {
	c := poolConfig(64)
	c.HidePrefixCachingLabel = true
	s, base := startServer(t, c)
	prompt := strings.Repeat("The same long prompt for every request. ", 8)
	for range 2 {
		if code, b := post(t, base+"/v1/completions", `{"model":"llama-3-8b","prompt":"`+prompt+`","max_tokens":4}`); code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
	}
	m := scrape(t, base)
	lbl := `{engine="0",model_name="llama-3-8b"}`
	st := s.Stats()
	if st.PrefixCacheHits == 0 || st.PrefixCacheHits%16 != 0 {
		t.Fatalf("hits %d: want whole blocks of the shared prompt", st.PrefixCacheHits)
	}
	if m["vllm:prefix_cache_hits_total"+lbl] != float64(st.PrefixCacheHits) || m["vllm:prefix_cache_queries_total"+lbl] != float64(st.PrefixCacheQueries) {
		t.Errorf("/metrics: hits %g, queries %g; want %d, %d", m["vllm:prefix_cache_hits_total"+lbl], m["vllm:prefix_cache_queries_total"+lbl], st.PrefixCacheHits, st.PrefixCacheQueries)
	}
	info := `vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="1",model_name="llama-3-8b",num_cpu_blocks="None",num_gpu_blocks="64"}`
	if m[info] != 1 {
		for k := range m {
			if strings.HasPrefix(k, "vllm:cache_config_info") {
				t.Logf("served: %s", k)
			}
		}
		t.Fatalf("no %s", info)
	}
}
