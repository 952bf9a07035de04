package kvbudget

import (
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
)

func loadTestModel(t *testing.T, name string) *Model {
	t.Helper()
	m, err := ReadModelConfig(os.DirFS("testdata"), name+".json")
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return m
}

// The expected values are worked by hand from each config (see the comment
// on each row); the published anchors are the PagedAttention paper's ~800 KB
// per token for OPT-13B, and 512 KiB (Llama-2-7B) and 128 KiB (Llama-3-8B).
func TestGeometryFamilies(t *testing.T) {
	tests := []struct {
		file          string
		family        Family
		layers        int
		kvHeads       int
		headDim       int
		dtypeBytes    int
		bytesPerToken int64 // TP=1, auto dtype
	}{
		{"llama-2-7b", FamilyLlama, 32, 32, 128, 2, 512 << 10},       // 2*32*32*128*2
		{"meta-llama-3-8b", FamilyLlama, 32, 8, 128, 2, 128 << 10},   // 2*32*8*128*2
		{"mistral-7b", FamilyLlama, 32, 8, 128, 2, 131072},           // as Llama-3-8B
		{"mixtral-8x7b", FamilyLlama, 32, 8, 128, 2, 131072},         // experts do not change the cache
		{"qwen2-7b", FamilyLlama, 28, 4, 128, 2, 57344},              // 2*28*4*128*2
		{"gemma-7b", FamilyLlama, 28, 16, 256, 2, 458752},            // head_dim 256 != 3072/16
		{"gemma-2-9b", FamilyLlama, 42, 8, 256, 2, 344064},           // float32 checkpoint served in fp16
		{"phi-3-mini", FamilyLlama, 32, 32, 96, 2, 393216},           // 2*32*32*96*2
		{"opt-13b", FamilyOPT, 40, 40, 128, 2, 819200},               // 800 KiB, the paper's "800 KB"
		{"gpt2", FamilyGPT2, 12, 12, 64, 2, 36864},                   // no torch_dtype: fp32 -> fp16
		{"starcoder", FamilyGPT2, 40, 1, 128, 2, 20480},              // multi_query: one KV head
		{"falcon-7b", FamilyFalcon, 32, 1, 64, 2, 8192},              // multi_query, old architecture
		{"falcon-7b-refinedweb", FamilyFalcon, 32, 1, 64, 2, 8192},   // n_head / n_layer spelling
		{"falcon-40b", FamilyFalcon, 60, 8, 64, 2, 122880},           // new architecture: num_kv_heads wins over multi_query
		{"chatglm3-6b", FamilyChatGLM, 28, 2, 128, 2, 28672},         // multi_query_group_num, kv_channels
		{"mpt-7b", FamilyMPT, 32, 32, 128, 2, 524288},                // no attn_config.kv_n_heads: MHA
		{"dbrx", FamilyDBRX, 40, 8, 128, 2, 163840},                  // attn_config.kv_n_heads
		{"deepseek-v2-lite", FamilyDeepSeek, 27, 1, 576, 2, 31104},   // 27*(512+64)*2, no factor 2
		{"deepseek-v3", FamilyDeepSeek, 61, 1, 576, 2, 70272},        // 61*(512+64)*2
		{"llama-3.2-11b-vision", FamilyLlama, 40, 8, 128, 2, 163840}, // read from text_config
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			m := loadTestModel(t, tt.file)
			l, err := m.KVLayout(KVSpec{})
			if err != nil {
				t.Fatal(err)
			}
			if m.Family != tt.family || l.Layers != tt.layers || l.KVHeads != tt.kvHeads || l.HeadDim != tt.headDim || l.DType.Bytes() != tt.dtypeBytes {
				t.Errorf("got family %s layers %d kv heads %d head dim %d dtype %s; want %s %d %d %d %d bytes",
					m.Family, l.Layers, l.KVHeads, l.HeadDim, l.DType, tt.family, tt.layers, tt.kvHeads, tt.headDim, tt.dtypeBytes)
			}
			if l.BytesPerToken != tt.bytesPerToken {
				t.Errorf("bytes per token = %d, want %d", l.BytesPerToken, tt.bytesPerToken)
			}
			if l.BytesPerBlock != 16*tt.bytesPerToken {
				t.Errorf("bytes per block = %d, want %d", l.BytesPerBlock, 16*tt.bytesPerToken)
			}
		})
	}
}

func TestKVLayoutTensorParallelAndDType(t *testing.T) {
	tests := []struct {
		file    string
		spec    KVSpec
		perGPU  int
		bytes   int64
		wantErr string
	}{
		{"meta-llama-3-8b", KVSpec{TP: 2}, 4, 65536, ""},
		{"meta-llama-3-8b", KVSpec{TP: 8}, 1, 16384, ""},
		{"meta-llama-3-8b", KVSpec{TP: 16}, 1, 16384, ""}, // 8 KV heads replicated over 16 GPUs
		{"meta-llama-3-8b", KVSpec{TP: 3}, 0, 0, "not divisible by tensor parallel size 3"},
		{"meta-llama-3-8b", KVSpec{TP: -1}, 0, 0, "tensor parallel size must be >= 1"},
		{"meta-llama-3-8b", KVSpec{KVDType: "fp8"}, 8, 65536, ""},
		{"meta-llama-3-8b", KVSpec{KVDType: "fp8_e5m2", TP: 2}, 4, 32768, ""},
		{"meta-llama-3-8b", KVSpec{KVDType: "float32"}, 8, 262144, ""},
		{"meta-llama-3-8b", KVSpec{KVDType: "int3"}, 0, 0, "unknown dtype"},
		{"meta-llama-3-8b", KVSpec{BlockSize: 32}, 8, 131072, ""},
		{"falcon-40b", KVSpec{TP: 8}, 1, 15360, ""},
		{"deepseek-v3", KVSpec{TP: 8}, 1, 70272, ""}, // the latent is replicated, not split
		{"deepseek-v3", KVSpec{TP: 8, KVDType: "fp8"}, 1, 35136, ""},
		{"qwen2-7b", KVSpec{TP: 4}, 1, 14336, ""},
		{"qwen2-7b", KVSpec{TP: 8}, 0, 0, "28 attention heads are not divisible"},
	}
	for _, tt := range tests {
		m := loadTestModel(t, tt.file)
		l, err := m.KVLayout(tt.spec)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s %+v: err = %v, want %q", tt.file, tt.spec, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s %+v: %v", tt.file, tt.spec, err)
			continue
		}
		if l.KVHeadsPerGPU != tt.perGPU || l.BytesPerToken != tt.bytes {
			t.Errorf("%s %+v: per GPU %d heads, %d B/token; want %d, %d", tt.file, tt.spec, l.KVHeadsPerGPU, l.BytesPerToken, tt.perGPU, tt.bytes)
		}
		bs := tt.spec.BlockSize
		if bs == 0 {
			bs = 16
		}
		if l.BytesPerBlock != int64(bs)*tt.bytes {
			t.Errorf("%s %+v: bytes per block %d", tt.file, tt.spec, l.BytesPerBlock)
		}
	}
}

// Published parameter counts, to within 3 %.
func TestParamEstimates(t *testing.T) {
	tests := []struct {
		file      string
		published float64
	}{
		{"llama-2-7b", 6.74e9},
		{"meta-llama-3-8b", 8.03e9},
		{"mistral-7b", 7.24e9},
		{"mixtral-8x7b", 46.7e9},
		{"qwen2-7b", 7.62e9},
		{"gemma-7b", 8.54e9},
		{"gemma-2-9b", 9.24e9},
		{"phi-3-mini", 3.82e9},
		{"opt-13b", 12.85e9},
		{"gpt2", 124e6},
		{"starcoder", 15.5e9},
		{"chatglm3-6b", 6.24e9},
		{"mpt-7b", 6.7e9},
		{"dbrx", 132e9},
		{"deepseek-v2-lite", 15.7e9},
		{"deepseek-v3", 671e9},
	}
	for _, tt := range tests {
		m := loadTestModel(t, tt.file)
		got := float64(m.EstimateParams().Total())
		if rel := math.Abs(got-tt.published) / tt.published; rel > 0.03 {
			t.Errorf("%s: estimated %.4g params, published %.4g (off by %.1f%%)", tt.file, got, tt.published, 100*rel)
		}
	}
}

func TestParamsExactLlama3(t *testing.T) {
	// 8,030,261,248 is the exact count of Meta-Llama-3-8B's safetensors.
	m := loadTestModel(t, "meta-llama-3-8b")
	if got := m.EstimateParams().Total(); got != 8030261248 {
		t.Errorf("params = %d, want 8030261248", got)
	}
	if got := m.WeightBytes(m.ServedDType()); got != 2*8030261248 {
		t.Errorf("weight bytes = %d, want %d", got, 2*8030261248)
	}
}

func TestWeightBytesQuantized(t *testing.T) {
	m := loadTestModel(t, "deepseek-v3")
	if m.QuantBits != 8 {
		t.Fatalf("quant bits = %d, want 8 (fp8 checkpoint)", m.QuantBits)
	}
	p := m.EstimateParams()
	want := p.Linear + 2*(p.Embedding+p.Other)
	if got := m.WeightBytes(m.ServedDType()); got != want {
		t.Errorf("weight bytes = %d, want %d", got, want)
	}
	awq := []byte(`{"model_type":"llama","hidden_size":4096,"intermediate_size":14336,"num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":8,"vocab_size":128256,"torch_dtype":"float16","quantization_config":{"bits":4,"quant_method":"awq"}}`)
	q, err := ParseModelConfig(awq)
	if err != nil {
		t.Fatal(err)
	}
	qp := q.EstimateParams()
	if got, want := q.WeightBytes(Float16), qp.Linear/2+2*(qp.Embedding+qp.Other); got != want {
		t.Errorf("awq weight bytes = %d, want %d", got, want)
	}
}

func TestBadConfigs(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		wantErr string
		missing bool
	}{
		{"invalid json", `{"model_type": "llama",`, "invalid JSON", false},
		{"not an object", `[1,2]`, "invalid JSON", false},
		{"null", `null`, "not a JSON object", false},
		{"no layers", `{"model_type":"llama","hidden_size":4096,"num_attention_heads":32}`, `"num_hidden_layers"`, true},
		{"no heads", `{"model_type":"llama","hidden_size":4096,"num_hidden_layers":32}`, `"num_attention_heads"`, true},
		{"no hidden", `{"model_type":"llama","num_attention_heads":32,"num_hidden_layers":32}`, `"hidden_size"`, true},
		{"gpt2 no layers", `{"model_type":"gpt2","n_embd":768,"n_head":12}`, `"n_layer"`, true},
		{"mpt no heads", `{"model_type":"mpt","d_model":4096,"n_layers":32}`, `"n_heads"`, true},
		{"chatglm no group", `{"model_type":"chatglm","hidden_size":4096,"num_layers":28,"num_attention_heads":32,"multi_query_attention":true}`, `"multi_query_group_num"`, true},
		{"deepseek no rope", `{"model_type":"deepseek_v3","hidden_size":7168,"num_hidden_layers":61,"num_attention_heads":128,"kv_lora_rank":512,"intermediate_size":18432}`, `"qk_rope_head_dim"`, true},
		{"hidden not divisible", `{"model_type":"llama","hidden_size":4096,"num_attention_heads":30,"num_hidden_layers":32}`, "not divisible by 30", false},
		{"kv heads not dividing", `{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,"num_key_value_heads":6,"num_hidden_layers":32}`, "not a multiple of 6 KV heads", false},
		{"zero kv heads", `{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,"num_key_value_heads":0,"num_hidden_layers":32}`, "must be > 0", false},
		{"negative layers", `{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,"num_hidden_layers":-1}`, `"num_hidden_layers"`, false},
		{"string layers", `{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,"num_hidden_layers":"32"}`, "want a number", false},
		{"zero layers", `{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,"num_hidden_layers":0}`, "must be > 0", false},
		{"bad dtype", `{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,"num_hidden_layers":32,"torch_dtype":"int3"}`, "unknown dtype", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseModelConfig([]byte(tt.json))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to contain %s", err, tt.wantErr)
			}
			if got := errors.Is(err, ErrMissingKey); got != tt.missing {
				t.Errorf("errors.Is(err, ErrMissingKey) = %v, want %v", got, tt.missing)
			}
		})
	}
}

// Issue 12, item 11: a config with the attention geometry but without what
// the weight estimate needs still gives its KV layout; its weights are
// unknown, and which keys are lacking is said.
func TestWeightKeysMissing(t *testing.T) {
	tests := []struct {
		name, json    string
		bytesPerToken int64
		missing       []string
	}{
		{"deepseek without intermediate_size",
			`{"model_type":"deepseek_v3","hidden_size":7168,"num_hidden_layers":61,"num_attention_heads":128,"kv_lora_rank":512,"qk_rope_head_dim":64,"vocab_size":129280,"torch_dtype":"bfloat16"}`,
			61 * 576 * 2, []string{"intermediate_size"}},
		{"deepseek MoE without moe_intermediate_size",
			`{"model_type":"deepseek_v3","hidden_size":7168,"num_hidden_layers":61,"num_attention_heads":128,"kv_lora_rank":512,"qk_rope_head_dim":64,"vocab_size":129280,"intermediate_size":18432,"n_routed_experts":256,"torch_dtype":"bfloat16"}`,
			61 * 576 * 2, []string{"moe_intermediate_size"}},
		{"dbrx without ffn_config",
			`{"model_type":"dbrx","d_model":6144,"n_layers":40,"n_heads":48,"attn_config":{"kv_n_heads":8},"vocab_size":100352,"torch_dtype":"bfloat16"}`,
			2 * 40 * 8 * 128 * 2, []string{"ffn_config"}},
		{"llama with head_dim, without hidden_size and vocab_size",
			`{"model_type":"llama","num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"torch_dtype":"bfloat16"}`,
			2 * 32 * 8 * 128 * 2, []string{"hidden_size", "vocab_size"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseModelConfig([]byte(tt.json))
			if err != nil {
				t.Fatal(err)
			}
			l, err := m.KVLayout(KVSpec{})
			if err != nil || l.BytesPerToken != tt.bytesPerToken {
				t.Fatalf("bytes per token %d, %v; want %d", l.BytesPerToken, err, tt.bytesPerToken)
			}
			if m.WeightsKnown() || !slices.Equal(m.WeightKeysMissing, tt.missing) {
				t.Errorf("weights known %v, missing %v; want %v", m.WeightsKnown(), m.WeightKeysMissing, tt.missing)
			}
		})
	}
	m, err := ParseModelConfig([]byte(`{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,"num_hidden_layers":32,"vocab_size":32000}`))
	if err != nil || !m.WeightsKnown() {
		t.Errorf("a complete config: known %v, %v", m.WeightsKnown(), err)
	}
}

func TestReadModelConfigDirectoryAndMissing(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile("testdata/meta-llama-3-8b.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/config.json", data, 0o644); err != nil {
		t.Fatal(err)
	}
	fsys := os.DirFS(dir)
	if _, err := ReadModelConfig(fsys, "."); err != nil {
		t.Errorf("directory holding config.json: %v", err)
	}
	if _, err := ReadModelConfig(fsys, "nope.json"); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v, want not-exist", err)
	}
}
