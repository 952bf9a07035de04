package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/kvbudget"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

const llama3 = "../../examples/llama-3-8b.json"

func TestKVJSON(t *testing.T) {
	code, out, errOut := runCLI(t, "kv", "--model-config", llama3, "--tp", "2", "--json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	want := map[string]float64{
		"layers": 32, "kv_heads": 8, "kv_heads_per_gpu": 4, "head_dim": 128, "dtype_bytes": 2, "tp": 2, "block_size": 16,
		"bytes_per_token": 65536, "bytes_per_block": 1048576, "params": 8030261248, "weight_bytes": 16060522496,
		"weight_bytes_per_gpu": 8030261248,
	}
	for k, v := range want {
		if got, ok := r[k].(float64); !ok || got != v {
			t.Errorf("%s = %v, want %v", k, r[k], v)
		}
	}
}

func TestKVTextAndOverrides(t *testing.T) {
	code, out, _ := runCLI(t, "kv", "--model-config", llama3, "--kv-dtype", "fp8", "--block-size", "32", "--weights-bytes", "10GiB")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, s := range []string{"64.0 KiB (65536 bytes)", "per block", "2.0 MiB (2097152 bytes)", "10.0 GiB", "fp8 (1 bytes)"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}

func TestPlanJSON(t *testing.T) {
	code, out, errOut := runCLI(t, "plan", "--model-config", llama3, "--gpu-memory", "24GiB", "--context", "8192", "--json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r planReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	// Worked in kvbudget's TestBudgetLlama3On24GiB.
	if r.KVBudgetBytes != 2193088512 || r.Blocks != 1045 || r.Tokens != 16720 || r.MaxConcurrency != 2 || !r.Fits {
		t.Errorf("plan = %+v", r)
	}
	if len(r.GPUs) != len(kvbudget.CommonGPUs()) {
		t.Fatalf("gpus: %d rows", len(r.GPUs))
	}
	byName := map[string]planGPU{}
	for _, g := range r.GPUs {
		byName[g.Name] = g
	}
	// H100: 81559 MiB * 0.75 = 64,140,607,488 usable; minus weights and 1 GiB
	// = 47,006,343,168 bytes; /2 MiB = 22,414 blocks; /512 = 43 sequences.
	h := byName["H100 80GB"]
	if !h.Fits || h.KVBudgetBytes != 47006343168 || h.Blocks != 22414 || h.MaxConcurrency != 43 {
		t.Errorf("H100 row = %+v", h)
	}
}

func TestPlanDoesNotFit(t *testing.T) {
	code, out, _ := runCLI(t, "plan", "--model-config", "../../kvbudget/testdata/mixtral-8x7b.json", "--gpu-memory", "80GB")
	if code != exitNo {
		t.Errorf("exit %d, want %d", code, exitNo)
	}
	for _, s := range []string{`"80GB" read as GB (10^9)`, "DOES NOT FIT", "It fits with --tp 2"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	code, out, _ = runCLI(t, "plan", "--model-config", "../../kvbudget/testdata/mixtral-8x7b.json", "--gpu-memory", "80GB", "--json")
	if code != exitNo || !strings.Contains(out, `"fits": false`) || !strings.Contains(out, `"min_tp_that_fits": 2`) {
		t.Errorf("json exit %d:\n%s", code, out)
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	invalid := write("invalid.json", `{"model_type": "llama"`)
	noLayers := write("nolayers.json", `{"model_type":"llama","hidden_size":4096,"num_attention_heads":32}`)
	badHeads := write("badheads.json", `{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,"num_key_value_heads":5,"num_hidden_layers":2}`)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"kv"}, "--model-config is required"},
		{[]string{"kv", "--model-config", filepath.Join(dir, "missing.json")}, "no such file"},
		{[]string{"kv", "--model-config", invalid}, "invalid JSON"},
		{[]string{"kv", "--model-config", noLayers}, `"num_hidden_layers"`},
		{[]string{"kv", "--model-config", badHeads}, "not a multiple of 5 KV heads"},
		{[]string{"kv", "--model-config", llama3, "--tp", "0"}, "--tp must be >= 1"},
		{[]string{"kv", "--model-config", llama3, "--tp", "3"}, "not divisible by tensor parallel size 3"},
		{[]string{"kv", "--model-config", llama3, "--block-size", "0"}, "--block-size must be >= 1"},
		{[]string{"kv", "--model-config", llama3, "--kv-dtype", "int4"}, "unknown dtype"},
		{[]string{"kv", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"kv", "--model-config", llama3, "extra"}, `unexpected argument "extra"`},
		{[]string{"plan", "--model-config", llama3, "--gpu-memory", "-24GiB"}, "negative"},
		{[]string{"plan", "--model-config", llama3, "--gpu-memory", "lots"}, "invalid memory size"},
		{[]string{"plan", "--model-config", llama3, "--gpu-memory", "0GiB"}, "gpu memory must be > 0"},
		{[]string{"plan", "--model-config", llama3, "--gpu-memory", "24"}, `"24" has no unit: write 24GiB`},
		{[]string{"plan", "--model-config", llama3, "--gpu-memory", "24GiB", "--utilization", "1.5"}, "--utilization must be in (0, 1]"},
		{[]string{"plan", "--model-config", llama3, "--gpu-memory", "24GiB", "--context", "0"}, "--context must be >= 1"},
		{[]string{"plan", "--model-config", llama3, "--gpu-memory", "24GiB", "--reserve", "x"}, "invalid memory size"},
		{[]string{"nope"}, `unknown command "nope"`},
	}
	for _, tt := range tests {
		code, _, errOut := runCLI(t, tt.args...)
		if code != exitUsage || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tt.args, code, errOut, exitUsage, tt.want)
		}
	}
}

func TestHelpListsOnlyBuiltCommands(t *testing.T) {
	code, out, _ := runCLI(t, "--help")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, c := range commands() {
		if !strings.Contains(out, "  "+c.name+" ") {
			t.Errorf("--help lacks %s", c.name)
		}
		code, sub, _ := runCLI(t, c.name, "--help")
		if code != exitOK || !strings.Contains(sub, "Usage: kvgate "+c.name) {
			t.Errorf("%s --help: exit %d\n%s", c.name, code, sub)
		}
	}
}

// Issue 12, item 11: a config with the attention geometry but without the
// keys the weight estimate needs still gives its KV bytes (exit 0), with
// the weights marked unknown; plan says which key it needs, and works once
// the weights are given.
func TestKVWithoutWeightKeys(t *testing.T) {
	dir := t.TempDir()
	for name, cfg := range map[string]string{
		"deepseek.json": `{"model_type":"deepseek_v3","hidden_size":7168,"num_hidden_layers":61,"num_attention_heads":128,"kv_lora_rank":512,"qk_rope_head_dim":64,"vocab_size":129280,"torch_dtype":"bfloat16"}`,
		"dbrx.json":     `{"model_type":"dbrx","d_model":6144,"n_layers":40,"n_heads":48,"attn_config":{"kv_n_heads":8},"vocab_size":100352,"torch_dtype":"bfloat16"}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	deepseek, dbrx := filepath.Join(dir, "deepseek.json"), filepath.Join(dir, "dbrx.json")

	code, out, errOut := runCLI(t, "kv", "--model-config", deepseek)
	if code != exitOK || !strings.Contains(out, "per token") || !strings.Contains(out, "weights     unknown: the config lacks intermediate_size") {
		t.Fatalf("kv: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "kv", "--model-config", dbrx, "--json")
	var r kvReport
	if err := json.Unmarshal([]byte(out), &r); code != exitOK || err != nil {
		t.Fatalf("kv --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	if r.BytesPerToken != 2*40*8*128*2 || r.WeightBytes != 0 || len(r.WeightsUnknown) != 1 || r.WeightsUnknown[0] != "ffn_config" {
		t.Errorf("kv --json: %+v", r)
	}

	code, _, errOut = runCLI(t, "plan", "--model-config", deepseek, "--gpu-memory", "80GiB")
	if code != exitUsage || !strings.Contains(errOut, "the weight estimate needs intermediate_size") || !strings.Contains(errOut, "--weights-bytes") {
		t.Errorf("plan without weights: exit %d: %s", code, errOut)
	}
	code, out, errOut = runCLI(t, "plan", "--model-config", dbrx, "--gpu-memory", "80GiB", "--tp", "8", "--weights-bytes", "264GB")
	if code != exitOK || !strings.Contains(out, "KV budget per GPU") || !strings.Contains(out, "params unknown, 245.9 GiB of weights as given by --weights-bytes") {
		t.Errorf("plan with --weights-bytes: exit %d\n%s%s", code, out, errOut)
	}
}

// --price ranks the GPUs that fit by cost per million tokens at their
// planned concurrency, from the memory-bandwidth bound of decoding.
func TestPlanPrice(t *testing.T) {
	code, out, errOut := runCLI(t, "plan", "--model-config", llama3, "--gpu-memory", "24GiB", "--context", "8192", "--json",
		"--price", "a100-80gb=2.10/h,L4=0.80/h,h100=4.50/h,rtx-4090-24gb=0.70")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r planReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	by := map[string]planGPU{}
	for _, g := range r.GPUs {
		by[g.Name] = g
	}
	a100 := by["A100 80GB"]
	kvPerSeq := int64(8192) * 131072
	wantTPS := kvbudget.DecodeBound(2039e9, r.WeightBytesPerGPU, kvPerSeq, a100.MaxConcurrency)
	if a100.DecodeTokensPerS != wantTPS || a100.CostPerMillionToken == nil || *a100.CostPerMillionToken != 2.10/(wantTPS*3600)*1e6 {
		t.Errorf("A100 80GB: %+v, want %g tok/s", a100, wantTPS)
	}
	// L4's weights fit but no 8k sequence does: priced, not ranked.
	if l4 := by["L4 24GB"]; l4.PricePerHour != 0.80 || l4.CostPerMillionToken != nil || l4.CostRank != 0 {
		t.Errorf("L4: %+v", l4)
	}
	// Ranks follow cost; unpriced GPUs are not ranked.
	ranked := []planGPU{}
	for _, g := range r.GPUs {
		if g.CostRank > 0 {
			ranked = append(ranked, g)
		}
	}
	slices.SortFunc(ranked, func(a, b planGPU) int { return a.CostRank - b.CostRank })
	if len(ranked) != 3 || by["H200 141GB"].CostRank != 0 {
		t.Fatalf("ranked %+v", ranked)
	}
	for i := 1; i < len(ranked); i++ {
		if *ranked[i].CostPerMillionToken < *ranked[i-1].CostPerMillionToken || ranked[i].CostRank != i+1 {
			t.Errorf("rank %d (%s, %g) after %s (%g)", ranked[i].CostRank, ranked[i].Name, *ranked[i].CostPerMillionToken, ranked[i-1].Name, *ranked[i-1].CostPerMillionToken)
		}
	}
	// The text lists the ranked GPUs first, cheapest first.
	_, text, _ := runCLI(t, "plan", "--model-config", llama3, "--gpu-memory", "24GiB", "--context", "8192",
		"--price", "a100-80gb=2.10/h,h100=4.50/h")
	lines := strings.Split(text, "\n")
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "GPU ") })
	if i < 0 || !strings.Contains(lines[i], "cost/Mtok") || !strings.HasPrefix(lines[i+1], ranked[0].Name) {
		t.Errorf("text table:\n%s", text)
	}
}

func TestPlanPriceErrors(t *testing.T) {
	for _, tc := range []struct{ price, want string }{
		{"a100=2/h", `"a100" could be A100 40GB or A100 80GB`},
		{"b200=9/h", `"b200" is none of the common GPUs`},
		{"h100=cheap", `h100: price "cheap"`},
		{"h100", "want GPU=PRICE/h"},
		{"h100=1/h,H100 80GB=2/h", "H100 80GB is priced twice"},
	} {
		code, _, errOut := runCLI(t, "plan", "--model-config", llama3, "--gpu-memory", "24GiB", "--price", tc.price)
		if code != exitUsage || !strings.Contains(errOut, "--price: ") || !strings.Contains(errOut, tc.want) {
			t.Errorf("--price %s: exit %d: %s", tc.price, code, errOut)
		}
	}
}
