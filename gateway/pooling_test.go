package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/kvbudget"
)

// A pooling body is read once, by the rules a completion's is: each input
// (or each pair a score or a rerank compares) is one prompt, and what the
// gateway cannot read as vLLM would is a 400 naming the field.
func TestParsePooling(t *testing.T) {
	var p fastjson.Parser
	for _, tc := range []struct {
		name   string
		kind   endpoint
		body   string
		shapes []promptShape // nil: an error naming param
		param  string
	}{
		{"one text", embeddings, `{"model":"m","input":"abc"}`, []promptShape{{textBytes: 3}}, ""},
		{"texts", embeddings, `{"model":"m","input":["ab","c"],"encoding_format":"base64","dimensions":8}`, []promptShape{{textBytes: 2}, {textBytes: 1}}, ""},
		{"token ids", poolingRoute, `{"model":"m","input":[1,2,3]}`, []promptShape{{tokenIDs: 3, ids: true}}, ""},
		{"lists of token ids", classify, `{"model":"m","input":[[1,2],[3]]}`, []promptShape{{tokenIDs: 2, ids: true}, {tokenIDs: 1, ids: true}}, ""},
		{"messages", embeddings, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, []promptShape{{textBytes: 2, messages: 1}}, ""},
		{"score one to many", score, `{"model":"m","text_1":"ab","text_2":["c","de"]}`, []promptShape{{textBytes: 4}, {textBytes: 5}}, ""},
		{"score pairwise", scoreV1, `{"model":"m","queries":["a","bb"],"documents":["c","d"]}`, []promptShape{{textBytes: 3}, {textBytes: 4}}, ""},
		{"rerank", rerankV2, `{"model":"m","query":"q","documents":["ab","c"],"top_n":1}`, []promptShape{{textBytes: 4}, {textBytes: 3}}, ""},

		{"no model", embeddings, `{"input":"a"}`, nil, "model"},
		{"no input", embeddings, `{"model":"m"}`, nil, "input"},
		{"input of a number", embeddings, `{"model":"m","input":5}`, nil, "input"},
		{"empty input", embeddings, `{"model":"m","input":[]}`, nil, "input"},
		{"mixed token ids", embeddings, `{"model":"m","input":[1,"a"]}`, nil, "input[1]"},
		{"fractional token id", embeddings, `{"model":"m","input":[[1,2.5]]}`, nil, "input[0][1]"},
		{"an input of an object", embeddings, `{"model":"m","input":["a",{}]}`, nil, "input[1]"},
		{"duplicate model", embeddings, `{"model":"m","input":"a","model":"n"}`, nil, "model"},
		{"duplicate input, escaped", embeddings, `{"model":"m","inp\u0075t":"a","input":["b","c"]}`, nil, "input"},
		{"duplicate input", embeddings, `{"model":"m","input":"a","input":["b","c"]}`, nil, "input"},
		{"duplicate text_2", score, `{"model":"m","text_1":"a","text_2":"b","text_2":["c","d"]}`, nil, "text_2"},
		{"duplicate documents", rerank, `{"model":"m","query":"a","documents":["b"],"documents":["c","d"]}`, nil, "documents"},
		{"duplicate truncate_prompt_tokens", embeddings, `{"model":"m","input":"a","truncate_prompt_tokens":1,"truncate_prompt_tokens":9}`, nil, "truncate_prompt_tokens"},
		{"huge top_n", rerank, `{"model":"m","query":"a","documents":["b"],"top_n":9223372036854775808}`, nil, "top_n"},
		{"huge dimensions", embeddings, `{"model":"m","input":"a","dimensions":1e400}`, nil, "dimensions"},
		{"huge token id", embeddings, `{"model":"m","input":[99999999999999999999]}`, nil, "input[0]"},
		{"negative dimensions", embeddings, `{"model":"m","input":"a","dimensions":-1}`, nil, "dimensions"},
		{"encoding_format of a number", embeddings, `{"model":"m","input":"a","encoding_format":1}`, nil, "encoding_format"},
		{"text_1 longer than text_2", score, `{"model":"m","text_1":["a","b"],"text_2":["c","d","e"]}`, nil, "text_1"},
		{"text_2 of a number", score, `{"model":"m","text_1":"a","text_2":[1]}`, nil, "text_2[0]"},
		{"query of a list", rerank, `{"model":"m","query":["a"],"documents":["b"]}`, nil, "query"},
		{"no documents", rerankV1, `{"model":"m","query":"a"}`, nil, "documents"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parsePooling(&p, []byte(tc.body), tc.kind)
			if tc.shapes == nil {
				pe, ok := err.(*parseError)
				if !ok || pe.param != tc.param {
					t.Fatalf("%s: error %v; want a 400 naming %q", tc.body, err, tc.param)
				}
				return
			}
			if err != nil {
				t.Fatalf("%s: %v", tc.body, err)
			}
			if r.model != "m" || fmt.Sprint(withoutPieces(r.shapes)) != fmt.Sprint(tc.shapes) {
				t.Fatalf("%s: model %q shapes %+v; want %+v", tc.body, r.model, r.shapes, tc.shapes)
			}
		})
	}
	if _, err := parsePooling(&p, []byte(`{"model":"m","input":[`+strings.Repeat(`"a",`, maxPoolingInputs)+`"a"]}`), embeddings); err == nil {
		t.Errorf("%d inputs accepted", maxPoolingInputs+1)
	}
}

// A pooling input's hold is its prompt's blocks, exactly: what a backend
// allocates for a prefill that decodes nothing, no decode slot, so no
// extra block when the prompt fills its last one.
func TestPoolingHoldIsThePromptsBlocks(t *testing.T) {
	l := kvbudget.KVLayout{BlockSize: 16, BytesPerBlock: 2 << 20}
	for _, tc := range []struct {
		name     string
		prompts  []int
		exact    bool
		truncate int
		blocks   int64 // 0: refused
	}{
		{"one token", []int{1}, true, 0, 1},
		{"a full block", []int{16}, true, 0, 1},
		{"a block and a token", []int{17}, true, 0, 2},
		{"two full blocks", []int{32}, true, 0, 2},
		{"a batch", []int{16, 17, 40}, true, 0, 1 + 2 + 3},
		{"the whole context", []int{64}, true, 0, 4},
		{"past the context, counted", []int{65}, true, 0, 0},
		{"past the context, estimated", []int{100}, false, 0, 4},
		{"truncated", []int{100}, true, 20, 2},
	} {
		x := &exchange{m: &model{name: "m", layout: l, maxLen: 64}, req: &request{kind: embeddings, model: "m"}}
		x.req.pool.truncate = tc.truncate
		exact := make([]bool, len(tc.prompts))
		for i := range exact {
			exact[i] = tc.exact
		}
		e := x.reservePooling(append([]int(nil), tc.prompts...), exact)
		if tc.blocks == 0 {
			if e == nil || e.param != "input" || e.code != "context_length_exceeded" {
				t.Errorf("%s: %+v; want context_length_exceeded naming input", tc.name, e)
			}
			continue
		}
		if e != nil {
			t.Fatalf("%s: %+v", tc.name, e)
		}
		if got := x.res.weight(); got != tc.blocks*l.BytesPerBlock {
			t.Errorf("%s: holds %d blocks, want %d", tc.name, got/l.BytesPerBlock, tc.blocks)
		}
		var shaped int64
		for _, g := range x.res.shape() {
			if g.Cap != 1 || g.Seqs != 1 || g.Prefix != nil {
				t.Errorf("%s: group %+v; want one sequence of cap 1 sharing nothing", tc.name, g)
			}
			shaped += kvbudget.GroupBlocks(g.Prompt, g.Cap, g.Seqs, g.BlockTokens, 0)
		}
		if shaped != tc.blocks {
			t.Errorf("%s: admission is shown %d blocks, want %d", tc.name, shaped, tc.blocks)
		}
	}
}

// Every pooling route reaches the backend's route of the same name,
// answers in vLLM's shape, and gives its reservation back.
func TestPoolingRoutesThroughGateway(t *testing.T) {
	_, url := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/embeddings", `{"model":"llama-3-8b","input":["hello there","general kenobi"]}`, `"object":"embedding"`},
		{"/v1/embeddings", `{"model":"llama-3-8b","input":[[1,2,3]],"encoding_format":"base64"}`, `"embedding":"`},
		{"/pooling", `{"model":"llama-3-8b","input":"hello"}`, `"object":"pooling"`},
		{"/classify", `{"model":"llama-3-8b","input":["good","bad"]}`, `"num_classes":2`},
		{"/score", `{"model":"llama-3-8b","text_1":"q","text_2":["a","b"]}`, `"object":"score"`},
		{"/v1/score", `{"model":"llama-3-8b","queries":["q"],"documents":["a"]}`, `"object":"score"`},
		{"/rerank", `{"model":"llama-3-8b","query":"q","documents":["a","b","c"],"top_n":2}`, `"relevance_score"`},
		{"/v1/rerank", `{"model":"llama-3-8b","query":"q","documents":["a"]}`, `"relevance_score"`},
		{"/v2/rerank/", `{"model":"llama-3-8b","query":"q","documents":["a"]}`, `"relevance_score"`},
	} {
		r := postJSON(gwURL, tc.path, tc.body)
		if r.err != nil || r.status != 200 || !strings.Contains(r.body, tc.want) || !strings.Contains(r.body, `"model":"llama-3-8b"`) {
			t.Errorf("%s: %d %v %.300s", tc.path, r.status, r.err, r.body)
		}
		if !json.Valid([]byte(r.body)) || r.header.Get("X-Kvgate-Backend") != "gpu0" {
			t.Errorf("%s: not a JSON answer from gpu0: %v %.300s", tc.path, r.header, r.body)
		}
		eventually(t, tc.path+"'s reservation to go back", func() bool { return held(gw) == 0 })
	}
	if r := postJSON(gwURL, "/v1/embeddings", `{"model":"llama-3-8b","input":"a","input":"b"}`); r.status != 400 || *decodeError(t, r.body).Error.Param != "input" {
		t.Errorf("duplicate input: %d %s", r.status, r.body)
	}
	if r := postJSON(gwURL, "/rerank", `{"model":"llama-3-8b","query":"q","documents":["a"],"top_n":1e999}`); r.status != 400 || *decodeError(t, r.body).Error.Param != "top_n" {
		t.Errorf("huge top_n: %d %s", r.status, r.body)
	}
	if r := postJSON(gwURL, "/score", `{"model":"llama-3-8b","text_1":"q","text_2":[1]}`); r.status != 400 || *decodeError(t, r.body).Error.Param != "text_2[0]" {
		t.Errorf("text_2 of numbers: %d %s", r.status, r.body)
	}
	if r := postJSON(gwURL, "/v1/embeddings", `{"model":"nope","input":"a"}`); r.status != 404 {
		t.Errorf("unknown model: %d %s", r.status, r.body)
	}
	resp, err := httpClient.Get(gwURL + "/v1/embeddings")
	if err != nil || resp.StatusCode != 405 {
		t.Errorf("GET /v1/embeddings: %v %v; want 405", resp, err)
	}
	resp.Body.Close()
	r := postJSON(gwURL, "/v1/nope", `{}`)
	for _, route := range poolingPaths {
		if !strings.Contains(r.body, "POST "+route+",") {
			t.Errorf("the 404 does not name %s: %s", route, r.body)
		}
	}
	if held(gw) != 0 {
		t.Errorf("%d bytes still held", held(gw))
	}
}

// A pooling answer's usage is read as a completion's: its prompt tokens,
// which the backend's /tokenize counted exactly for one text each, and a
// rerank's total; no output is reserved or reported.
func TestPoolingUsageRead(t *testing.T) {
	_, url := startSim(t, nil)
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	tokens := func(kind, which string) float64 {
		name := "kvgate_tokens_" + which + "_total"
		v, _ := metricValue(t, gw, name, map[string]string{"model": "llama-3-8b", "kind": kind})
		return v
	}
	if r := postJSON(gwURL, "/v1/embeddings", `{"model":"llama-3-8b","input":["hello there","general kenobi"]}`); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if p, a := tokens("prompt", "predicted"), tokens("prompt", "actual"); p == 0 || p != a {
		t.Errorf("prompt tokens predicted %v, reported %v; want the backend's exact count read back", p, a)
	}
	before := tokens("prompt", "actual")
	if r := postJSON(gwURL, "/rerank", `{"model":"llama-3-8b","query":"q","documents":["a","b"]}`); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if a := tokens("prompt", "actual"); a <= before {
		t.Errorf("a rerank's total_tokens not read: %v then %v", before, a)
	}
	if p, a := tokens("output", "predicted"), tokens("output", "actual"); p != 0 || a != 0 {
		t.Errorf("output tokens predicted %v, reported %v; want none", p, a)
	}
}

// A served_name is rewritten to the backend's model name in the body
// forwarded and back in the answer, as for completions.
func TestPoolingServedName(t *testing.T) {
	_, url := startSim(t, nil)
	cfg := strings.Replace(baseConfig(url, ""), "  - name: llama-3-8b\n", "  - name: llama-3-8b\n    served_name: embed\n", 1)
	_, gw := startGateway(t, cfg, Options{})
	for _, path := range []string{"/v1/embeddings", "/rerank"} {
		body := `{"model":"embed","input":"hello"}`
		if path == "/rerank" {
			body = `{"model":"embed","query":"q","documents":["a"]}`
		}
		r := postJSON(gw, path, body)
		if r.status != 200 || strings.Contains(r.body, "llama-3-8b") || !strings.Contains(r.body, `"model":"embed"`) {
			t.Errorf("%s: %d %.300s", path, r.status, r.body)
		}
	}
}

// A client that hangs up while its pooling request runs cancels it on the
// backend, and its reservation goes back admission.abort_hold later on
// the gateway's clock.
func TestPoolingReleasedOnClientAbort(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) { c.TimeScale, c.StepBase = 1, time.Hour }) // the prefill never ends
	clock := newClock()
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{Clock: clock})
	c, _ := rawRequest(t, gwURL, "/v1/embeddings", `{"model":"llama-3-8b","input":["one","two"]}`)
	// Each input is a request of the backend's own; one submitted after the
	// engine planned its (endless) step waits for the next.
	eventually(t, "the backend to take both inputs", func() bool { st := backend.Stats(); return st.Running >= 1 && st.Running+st.Waiting == 2 })
	if held(gw) == 0 {
		t.Fatal("nothing held while the request runs")
	}
	c.Close()
	advanceUntil(t, clock, 100*time.Millisecond, "the reservation to be released", func() bool { return held(gw) == 0 })
	eventually(t, "the backend to abort", func() bool { st := backend.Stats(); return st.Running+st.Waiting == 0 })
}

// A backend that fails while it runs a pooling request (here it shuts
// down, failing what it runs) has the client told so, and the
// reservation goes back.
func TestPoolingReleasedOnBackendFailure(t *testing.T) {
	backend, url := startSim(t, func(c *sim.Config) { c.TimeScale, c.StepBase = 1, time.Hour }) // the prefill never ends
	gw, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	got := make(chan result, 1)
	go func() { got <- postJSON(gwURL, "/score", `{"model":"llama-3-8b","text_1":"q","text_2":["a","b","c"]}`) }()
	eventually(t, "the backend to take the three pairs", func() bool { st := backend.Stats(); return st.Running >= 1 && st.Running+st.Waiting == 3 })
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no grace: what runs fails at once
	backend.Shutdown(ctx)
	r := <-got
	if r.status != 502 && r.status != 503 {
		t.Errorf("%d %.300s; want the backend's failure", r.status, r.body)
	}
	eventually(t, "the reservation to go back", func() bool { return held(gw) == 0 })
}

func FuzzParsePooling(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hello"}`,
		`{"model":"m","input":["a","b"],"encoding_format":"base64","dimensions":8,"truncate_prompt_tokens":4}`,
		`{"model":"m","input":[1,2,3]}`, `{"model":"m","input":[[1],[2,3]]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","text_1":"a","text_2":["b","c"]}`, `{"model":"m","queries":["a"],"documents":["b"]}`,
		`{"model":"m","query":"q","documents":["a","b"],"top_n":1}`,
		`{"model":"m","input":"a","input":"b"}`, `{"model":"m","query":"q","documents":["a"],"top_n":1e400}`,
		`{"model":"m","input":[1,"a"]}`, `{"model":"\u0000","input":"\ud800"}`, `[]`, `{`,
	} {
		for k := embeddings; k <= rerankV2; k++ {
			f.Add([]byte(s), uint8(k-embeddings))
		}
	}
	var p fastjson.Parser
	var pp fastjson.ParserPool
	f.Fuzz(func(t *testing.T, body []byte, k uint8) {
		kind := embeddings + endpoint(k%uint8(len(poolingPaths)))
		r, err := parsePooling(&p, body, kind)
		if err != nil {
			pe, ok := err.(*parseError)
			if !ok || err.Error() == "" {
				t.Fatalf("error of type %T: %v", err, err)
			}
			e := &apiError{status: 400, typ: typeInvalidRequest, param: pe.param, message: pe.msg}
			if out := e.appendJSON(nil, true); !json.Valid(out) {
				t.Fatalf("error body not JSON: %q from %q", out, body)
			}
			return
		}
		if r.model == "" || r.kind != kind || len(r.shapes) == 0 || len(r.shapes) > maxPoolingInputs || r.pool.truncate < 0 {
			t.Fatalf("insane request %+v from %q", r, body)
		}
		if err := poolingTexts(&pp, body, r); err != nil {
			t.Fatalf("poolingTexts(%q): %v", body, err)
		}
		for i, pt := range r.prompts {
			if pt.text != nil && !json.Valid(pt.text) {
				t.Fatalf("input %d of %q is not a JSON string: %q", i, body, pt.text)
			}
		}
	})
}
