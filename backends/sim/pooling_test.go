package sim

import (
	"encoding/base64"
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"
)

// poolReq is a pooling request of prompt tokens, as the handler makes it.
func poolReq(prompt int) *request {
	r := newRequest(prompt, 1, 1, time.Time{})
	r.pooling = true
	r.seqs[0].target = 1
	return r
}

func TestPoolingHoldsPromptBlocksForItsPrefill(t *testing.T) {
	for _, tc := range []struct {
		prompt int
		blocks int64 // Blocks(prompt) at 16 tokens a block: no decode slot
	}{{1, 1}, {16, 1}, {17, 2}, {32, 2}, {33, 3}} {
		e, _ := newTestEngine(t, poolConfig(64))
		r := poolReq(tc.prompt)
		mustSubmit(t, e, r)
		if _, ok := e.plan(); !ok {
			t.Fatal("nothing planned")
		}
		if e.used != tc.blocks {
			t.Errorf("prompt %d: holds %d blocks during its prefill, want %d", tc.prompt, e.used, tc.blocks)
		}
		e.commit()
		st := e.stats()
		if r.status.Load() != statusFinished || st.UsedBlocks != 0 || st.GenerationTokens != 0 || st.FinishedStop != 1 || st.PromptTokens != int64(tc.prompt) {
			t.Errorf("prompt %d after its step: status %d, %+v; want finished, nothing held or generated, one stop", tc.prompt, r.status.Load(), st)
		}
	}
}

func TestPoolingFloodOverflows(t *testing.T) {
	// Three prompts of 3 blocks each on a pool of 8.
	t.Run("oom", func(t *testing.T) {
		c := poolConfig(8)
		c.MaxModelLen = 64
		c.OnOverflow = OverflowOOM
		e, _ := newTestEngine(t, c)
		rs := []*request{poolReq(48), poolReq(48), poolReq(48)}
		mustSubmit(t, e, rs...)
		e.step()
		if st := e.stats(); st.OOMEvents != 1 || st.UsedBlocks != 0 {
			t.Fatalf("%+v; want one OOM event", st)
		}
		for i, r := range rs {
			if r.status.Load() != statusFailed || !strings.Contains(r.err.Error(), "CUDA out of memory") {
				t.Errorf("request %d: status %d err %v; want failed by the OOM", i, r.status.Load(), r.err)
			}
		}
	})
	t.Run("preempt", func(t *testing.T) {
		c := poolConfig(8)
		c.MaxModelLen = 64
		e, _ := newTestEngine(t, c)
		rs := []*request{poolReq(48), poolReq(48), poolReq(48)}
		mustSubmit(t, e, rs...)
		steps := 0
		for ; steps < 10; steps++ {
			if _, ok := e.step(); !ok {
				break
			}
		}
		if st := e.stats(); st.PeakUsedBlocks > 8 || st.FinishedStop != 3 || steps != 2 {
			t.Fatalf("%+v after %d steps; want all three served in two steps within the pool", st, steps)
		}
	})
}

func TestPoolingRoutes(t *testing.T) {
	_, base := startServer(t, Config{TimeScale: 0.001})
	type usage struct {
		PromptTokens *int `json:"prompt_tokens"`
		TotalTokens  *int `json:"total_tokens"`
	}
	for _, tc := range []struct {
		path, body string
		check      func(t *testing.T, b []byte)
	}{
		{"/v1/embeddings", `{"model":"llama-3-8b","input":["a b c","d e"]}`, func(t *testing.T, b []byte) {
			var a struct {
				Object string `json:"object"`
				Model  string `json:"model"`
				Data   []struct {
					Object    string    `json:"object"`
					Index     int       `json:"index"`
					Embedding []float64 `json:"embedding"`
				} `json:"data"`
				Usage usage `json:"usage"`
			}
			unmarshal(t, b, &a)
			if a.Object != "list" || a.Model != "llama-3-8b" || len(a.Data) != 2 || a.Data[1].Index != 1 || a.Data[0].Object != "embedding" || len(a.Data[0].Embedding) != embedDim {
				t.Errorf("%s", b)
			}
			if a.Usage.PromptTokens == nil || *a.Usage.PromptTokens != 4+3 || *a.Usage.TotalTokens != 7 {
				t.Errorf("usage %s; want 7 prompt tokens (BOS and the words)", b)
			}
		}},
		{"/v1/embeddings", `{"model":"llama-3-8b","input":[1,2,3],"encoding_format":"base64","dimensions":8}`, func(t *testing.T, b []byte) {
			var a struct {
				Data []struct {
					Embedding string `json:"embedding"`
				} `json:"data"`
				Usage usage `json:"usage"`
			}
			unmarshal(t, b, &a)
			raw, err := base64.StdEncoding.DecodeString(a.Data[0].Embedding)
			if err != nil || len(raw) != 4*8 || *a.Usage.PromptTokens != 3 {
				t.Errorf("%s: %d bytes, %v; want 8 float32s", b, len(raw), err)
			}
		}},
		{"/pooling", `{"model":"llama-3-8b","input":[[5,6],[7]]}`, func(t *testing.T, b []byte) {
			var a struct {
				Data []struct {
					Object string    `json:"object"`
					Data   []float64 `json:"data"`
				} `json:"data"`
				Usage usage `json:"usage"`
			}
			unmarshal(t, b, &a)
			if len(a.Data) != 2 || a.Data[0].Object != "pooling" || len(a.Data[0].Data) != embedDim || *a.Usage.PromptTokens != 3 {
				t.Errorf("%s", b)
			}
		}},
		{"/classify", `{"model":"llama-3-8b","input":"is this good"}`, func(t *testing.T, b []byte) {
			var a struct {
				Data []struct {
					Label      string    `json:"label"`
					Probs      []float64 `json:"probs"`
					NumClasses int       `json:"num_classes"`
				} `json:"data"`
				Usage usage `json:"usage"`
			}
			unmarshal(t, b, &a)
			if len(a.Data) != 1 || a.Data[0].NumClasses != 2 || len(a.Data[0].Probs) != 2 || !strings.HasPrefix(a.Data[0].Label, "LABEL_") || *a.Usage.PromptTokens != 1+countTokens([]byte("is this good")) {
				t.Errorf("%s", b)
			}
		}},
		{"/score", `{"model":"llama-3-8b","text_1":"q","text_2":["x","y z"]}`, func(t *testing.T, b []byte) {
			checkScores(t, b, 2, pairTokens("q", "x")+pairTokens("q", "y z"))
		}},
		{"/v1/score", `{"model":"llama-3-8b","queries":["q","r"],"documents":["x","y"]}`, func(t *testing.T, b []byte) {
			checkScores(t, b, 2, pairTokens("q", "x")+pairTokens("r", "y"))
		}},
		{"/rerank", `{"model":"llama-3-8b","query":"q","documents":["x","y z","w"],"top_n":2}`, func(t *testing.T, b []byte) {
			checkRerank(t, b, 2, pairTokens("q", "x")+pairTokens("q", "y z")+pairTokens("q", "w"))
		}},
		{"/v1/rerank", `{"model":"llama-3-8b","query":"q","documents":["x","y"]}`, func(t *testing.T, b []byte) { checkRerank(t, b, 2, pairTokens("q", "x")+pairTokens("q", "y")) }},
		{"/v2/rerank", `{"model":"llama-3-8b","query":"q","documents":["x"]}`, func(t *testing.T, b []byte) { checkRerank(t, b, 1, pairTokens("q", "x")) }},
	} {
		t.Run(tc.path, func(t *testing.T) {
			code, b := post(t, base+tc.path, tc.body)
			if code != 200 {
				t.Fatalf("%d %s", code, b)
			}
			tc.check(t, b)
		})
	}
}

// pairTokens is a scored pair's prompt: BOS, the query, a separator and
// the document.
func pairTokens(q, d string) int { return 2 + countTokens([]byte(q)) + countTokens([]byte(d)) }

func checkScores(t *testing.T, b []byte, n, tokens int) {
	t.Helper()
	var a struct {
		Object string `json:"object"`
		Data   []struct {
			Index  int     `json:"index"`
			Object string  `json:"object"`
			Score  float64 `json:"score"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	unmarshal(t, b, &a)
	if a.Object != "list" || len(a.Data) != n || a.Data[0].Object != "score" || a.Data[n-1].Index != n-1 || a.Usage.PromptTokens != tokens {
		t.Errorf("%s; want %d scores of %d prompt tokens", b, n, tokens)
	}
}

func checkRerank(t *testing.T, b []byte, n, tokens int) {
	t.Helper()
	var a struct {
		Model   string `json:"model"`
		Results []struct {
			Index    int `json:"index"`
			Document struct {
				Text string `json:"text"`
			} `json:"document"`
			RelevanceScore float64 `json:"relevance_score"`
		} `json:"results"`
		Usage struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	unmarshal(t, b, &a)
	if len(a.Results) != n || a.Usage.TotalTokens != tokens || a.Results[0].Document.Text == "" {
		t.Fatalf("%s; want %d results of %d tokens", b, n, tokens)
	}
	if !sort.SliceIsSorted(a.Results, func(i, j int) bool { return a.Results[i].RelevanceScore > a.Results[j].RelevanceScore }) {
		t.Errorf("results not best first: %s", b)
	}
}

func TestPoolingBadInput(t *testing.T) {
	_, base := startServer(t, Config{TimeScale: 0.001, MaxModelLen: 64})
	for _, tc := range []struct{ path, body, param string }{
		{"/v1/embeddings", `{"model":"llama-3-8b"}`, "input"},
		{"/v1/embeddings", `{"model":"llama-3-8b","input":[]}`, "input"},
		{"/v1/embeddings", `{"model":"llama-3-8b","input":[1,"a"]}`, "input"},
		{"/v1/embeddings", `{"model":"llama-3-8b","input":"a","encoding_format":"hex"}`, "encoding_format"},
		{"/v1/embeddings", `{"model":"llama-3-8b","input":"a","dimensions":0}`, "dimensions"},
		{"/v1/embeddings", `{"model":"llama-3-8b","input":"` + strings.Repeat("w ", 80) + `"}`, "input"},
		{"/score", `{"model":"llama-3-8b","text_1":["a","b"],"text_2":["c","d","e"]}`, "text_1"},
		{"/score", `{"model":"llama-3-8b","text_1":"a"}`, "text_2"},
		{"/rerank", `{"model":"llama-3-8b","documents":["a"]}`, "query"},
		{"/rerank", `{"model":"llama-3-8b","query":"q","documents":["a"],"top_n":-1}`, "top_n"},
	} {
		code, b := post(t, base+tc.path, tc.body)
		checkErrorBody(t, code, b, 400, "BadRequestError")
		var e struct{ Error struct{ Param string } }
		_ = json.Unmarshal(b, &e)
		if e.Error.Param != tc.param {
			t.Errorf("%s %s: param %q, want %q", tc.path, tc.body, e.Error.Param, tc.param)
		}
	}
	code, b := post(t, base+"/v1/embeddings", `{"model":"other","input":"a"}`)
	checkErrorBody(t, code, b, 404, "NotFoundError")
}
