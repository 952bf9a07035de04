package kvbudget

import (
	"fmt"
	"strings"
)

// Family names the key rules a config was read with.
type Family string

// The families whose key spellings ParseModelConfig knows. Any other
// model_type is read with the Llama rules, which is also what vLLM falls back
// to.
const (
	FamilyLlama    Family = "llama" // Llama, Mistral, Mixtral, Qwen2, Gemma, Phi-3 and most new models
	FamilyOPT      Family = "opt"
	FamilyGPT2     Family = "gpt2" // also GPTBigCode (StarCoder), GPT-J
	FamilyFalcon   Family = "falcon"
	FamilyChatGLM  Family = "chatglm"
	FamilyMPT      Family = "mpt"
	FamilyDBRX     Family = "dbrx"
	FamilyDeepSeek Family = "deepseek-mla"
)

// Model is what kvbudget knows of a model: its attention geometry, which sets
// the KV cache, and the shapes that set its parameter count.
type Model struct {
	ModelType string
	Family    Family

	Layers  int
	Heads   int // query heads
	KVHeads int // KV heads across all GPUs, as vLLM's get_total_num_kv_heads
	HeadDim int // size of one K (or V) head, as vLLM's get_head_size
	Hidden  int
	Vocab   int

	// MaxPositions is the context length the model was trained for
	// (max_position_embeddings or its family's spelling); 0 when unknown.
	MaxPositions int

	// DType is the checkpoint's dtype (torch_dtype, or dtype). A config that
	// names none is float32, as transformers assumes.
	DType DType

	// MLA is set for DeepSeek-V2/V3 style latent attention, whose cache holds
	// one latent of KVLoraRank+QKRopeHeadDim per layer instead of K and V.
	MLA *MLA

	// Shapes used only for the parameter estimate.
	Intermediate     int  // MLP width of a dense layer
	GatedMLP         bool // SwiGLU/GeGLU (three matrices) rather than two
	TiedEmbeddings   bool // the LM head reuses the input embedding
	LearnedPositions int  // rows of a learned position table (GPT-2, OPT); 0 for rotary
	QKVBias          bool // biases on the Q, K and V projections
	DenseBias        bool // biases on every linear layer (GPT-2, OPT)
	MoE              *MoE
	// QuantBits is the width of quantized linear weights (4 for GPTQ/AWQ int4,
	// 8 for FP8 checkpoints); 0 when the weights are in DType.
	QuantBits int

	// ImageTokens is what the model's largest image takes in the KV cache
	// (readImageTokens); 0 when the config does not say.
	ImageTokens int

	// WeightKeysMissing lists the config keys the parameter (and so weight)
	// estimate needs but the config lacks. The KV geometry does not need
	// them: a config with the attention shapes alone still gives bytes per
	// token, and its weights are unknown (see WeightsKnown).
	WeightKeysMissing []string
}

// WeightsKnown says whether EstimateParams and WeightBytes mean anything:
// the config has every key they need.
func (m *Model) WeightsKnown() bool { return len(m.WeightKeysMissing) == 0 }

// lacksForWeights notes a key only the weight estimate needs.
func (m *Model) lacksForWeights(key string) { m.WeightKeysMissing = append(m.WeightKeysMissing, key) }

// MLA is the latent-attention shape of DeepSeek-V2/V3.
type MLA struct {
	KVLoraRank    int
	QKRopeHeadDim int
	QKNopeHeadDim int
	VHeadDim      int
	QLoraRank     int // 0: queries are projected directly
}

// MoE is a mixture-of-experts MLP.
type MoE struct {
	Experts            int // routed experts per MoE layer
	ExpertIntermediate int // width of one expert
	SharedIntermediate int // total width of always-on shared experts
	DenseLayers        int // leading layers that keep a dense MLP
}

// ParseModelConfig reads a Hugging Face config.json.
func ParseModelConfig(data []byte) (*Model, error) {
	c, err := parseHFConfig(data)
	if err != nil {
		return nil, err
	}
	images, err := readImageTokens(c)
	if err != nil {
		return nil, err
	}
	// Multimodal wrappers (Llama-3.2-Vision, Gemma-3, LLaVA, ...) keep the
	// language model's keys under text_config, as vLLM's hf_text_config does.
	if tc := c.sub("text_config"); tc != nil && (tc.has("num_hidden_layers") || tc.has("hidden_size")) {
		for _, k := range []string{"torch_dtype", "dtype", "quantization_config", "model_type"} {
			if !tc.has(k) && c.has(k) {
				tc[k] = c[k]
			}
		}
		c = tc
	}
	m := &Model{ModelType: c.str("model_type"), ImageTokens: images}
	m.Family = familyOf(m.ModelType)
	if err := m.readDType(c); err != nil {
		return nil, err
	}
	switch m.Family {
	case FamilyGPT2:
		err = m.readGPT2(c)
	case FamilyFalcon:
		err = m.readFalcon(c)
	case FamilyChatGLM:
		err = m.readChatGLM(c)
	case FamilyMPT, FamilyDBRX:
		err = m.readMPT(c)
	case FamilyDeepSeek:
		err = m.readDeepSeek(c)
	default:
		err = m.readLlama(c)
	}
	if err != nil {
		return nil, err
	}
	if err := m.readQuant(c); err != nil {
		return nil, err
	}
	return m, m.check()
}

func familyOf(modelType string) Family {
	switch strings.ToLower(modelType) {
	case "opt":
		return FamilyOPT
	case "gpt2", "gpt_bigcode", "gptj":
		return FamilyGPT2
	case "falcon", "refinedweb", "refinedwebmodel":
		return FamilyFalcon
	case "chatglm", "glm":
		return FamilyChatGLM
	case "mpt":
		return FamilyMPT
	case "dbrx":
		return FamilyDBRX
	case "deepseek_v2", "deepseek_v3", "kimi_k2":
		return FamilyDeepSeek
	}
	return FamilyLlama
}

func (m *Model) readDType(c hfConfig) error {
	raw := c.str("torch_dtype")
	if raw == "" {
		raw = c.str("dtype")
	}
	if raw == "" {
		m.DType = Float32
		return nil
	}
	d, err := ParseDType(raw)
	if err != nil {
		return &keyError{keys: []string{"torch_dtype", "dtype"}, reason: err.Error()}
	}
	m.DType = d
	return nil
}

// kvHeadKeys are the spellings vLLM looks for, in its order, before falling
// back to the attention head count.
var kvHeadKeys = []string{"n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num"}

// readAttention fills Heads, KVHeads and HeadDim the way vLLM's generic path
// does: head_dim if the config gives it, else hidden/heads.
func (m *Model) readAttention(c hfConfig, headKeys []string) error {
	var err error
	if m.Heads, err = c.requireInt(headKeys...); err != nil {
		return err
	}
	if m.KVHeads, err = c.optInt(m.Heads, kvHeadKeys...); err != nil {
		return err
	}
	if m.KVHeads == 0 {
		return &keyError{keys: kvHeadKeys[2:3], reason: "must be > 0"}
	}
	return m.readHeadDim(c)
}

func (m *Model) readHeadDim(c hfConfig) error {
	hd, err := c.optInt(0, "head_dim", "hidden_size_per_head")
	if err != nil {
		return err
	}
	if hd > 0 {
		m.HeadDim = hd
		return nil
	}
	if m.Hidden == 0 {
		return &keyError{keys: []string{"head_dim", "hidden_size"}, reason: "missing"} // the head size is head_dim, else hidden_size / heads
	}
	if m.Hidden%m.Heads != 0 {
		return fmt.Errorf("hidden size %d is not divisible by %d attention heads, and the config gives no head_dim", m.Hidden, m.Heads)
	}
	m.HeadDim = m.Hidden / m.Heads
	return nil
}

// readCommon reads layers (required), and the hidden size and vocabulary,
// which only the weight estimate needs once the config gives head_dim.
func (m *Model) readCommon(c hfConfig, layerKeys, hiddenKeys []string) error {
	var err error
	if m.Layers, err = c.requireInt(layerKeys...); err != nil {
		return err
	}
	if m.Hidden, err = c.optInt(0, hiddenKeys...); err != nil {
		return err
	}
	if m.Hidden == 0 {
		m.lacksForWeights(hiddenKeys[0])
	}
	if m.Vocab, err = c.optInt(0, "vocab_size", "padded_vocab_size"); err != nil {
		return err
	}
	if m.Vocab == 0 {
		m.lacksForWeights("vocab_size")
	}
	m.MaxPositions, err = c.optInt(0, "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
	return err
}

func (m *Model) readLlama(c hfConfig) error {
	if err := m.readCommon(c, []string{"num_hidden_layers", "num_layers", "n_layer"}, []string{"hidden_size", "n_embd", "d_model"}); err != nil {
		return err
	}
	if err := m.readAttention(c, []string{"num_attention_heads", "n_head"}); err != nil {
		return err
	}
	var err error
	switch m.ModelType {
	case "opt":
		m.Intermediate, err = c.optInt(4*m.Hidden, "ffn_dim")
		m.LearnedPositions, _ = c.optInt(2048, "max_position_embeddings")
		m.LearnedPositions += 2 // OPT offsets positions by two
		m.DenseBias = c.boolKey(true, "enable_bias")
		m.TiedEmbeddings = c.boolKey(true, "tie_word_embeddings")
		return err
	case "gpt_neox":
		m.Intermediate, err = c.optInt(4*m.Hidden, "intermediate_size")
		m.DenseBias = true
		m.TiedEmbeddings = c.boolKey(false, "tie_word_embeddings")
		return err
	}
	if m.Intermediate, err = c.optInt(4*m.Hidden, "intermediate_size", "ffn_dim", "n_inner"); err != nil {
		return err
	}
	m.GatedMLP = true
	tiedByDefault := strings.HasPrefix(m.ModelType, "gemma")
	m.TiedEmbeddings = c.boolKey(tiedByDefault, "tie_word_embeddings")
	m.QKVBias = c.boolKey(strings.HasPrefix(m.ModelType, "qwen2"), "attention_bias") || c.boolKey(false, "qkv_bias")
	return m.readMoE(c)
}

// readMoE recognises the expert keys of Mixtral (num_local_experts), Qwen-MoE
// (num_experts, moe_intermediate_size, shared_expert_intermediate_size) and
// similar.
func (m *Model) readMoE(c hfConfig) error {
	experts, err := c.optInt(0, "num_local_experts", "num_experts", "n_routed_experts")
	if err != nil || experts == 0 {
		return err
	}
	moe := &MoE{Experts: experts}
	if moe.ExpertIntermediate, err = c.optInt(m.Intermediate, "moe_intermediate_size"); err != nil {
		return err
	}
	if moe.SharedIntermediate, err = c.optInt(0, "shared_expert_intermediate_size"); err != nil {
		return err
	}
	m.MoE = moe
	return nil
}

func (m *Model) readGPT2(c hfConfig) error {
	if err := m.readCommon(c, []string{"n_layer", "num_hidden_layers"}, []string{"n_embd", "hidden_size"}); err != nil {
		return err
	}
	if err := m.readAttention(c, []string{"n_head", "num_attention_heads"}); err != nil {
		return err
	}
	if c.boolKey(false, "multi_query") {
		m.KVHeads = 1 // GPTBigCode: one K/V head shared by all queries
	}
	var err error
	if m.Intermediate, err = c.optInt(4*m.Hidden, "n_inner"); err != nil {
		return err
	}
	if m.ModelType != "gptj" {
		m.LearnedPositions, _ = c.optInt(1024, "n_positions")
		m.DenseBias = true
	}
	m.TiedEmbeddings = c.boolKey(m.ModelType != "gptj", "tie_word_embeddings")
	return nil
}

// readFalcon follows vLLM: with new_decoder_architecture the KV head count is
// n_head_kv/num_kv_heads and multi_query is ignored; otherwise multi_query
// means a single KV head.
func (m *Model) readFalcon(c hfConfig) error {
	if err := m.readCommon(c, []string{"num_hidden_layers", "n_layer"}, []string{"hidden_size", "n_embd"}); err != nil {
		return err
	}
	if err := m.readAttention(c, []string{"num_attention_heads", "n_head"}); err != nil {
		return err
	}
	if !c.boolKey(false, "new_decoder_architecture") && c.boolKey(true, "multi_query") {
		m.KVHeads = 1
	}
	var err error
	m.Intermediate, err = c.optInt(4*m.Hidden, "ffn_hidden_size")
	m.TiedEmbeddings = c.boolKey(true, "tie_word_embeddings")
	return err
}

func (m *Model) readChatGLM(c hfConfig) error {
	if err := m.readCommon(c, []string{"num_layers", "num_hidden_layers"}, []string{"hidden_size"}); err != nil {
		return err
	}
	var err error
	if m.Heads, err = c.requireInt("num_attention_heads"); err != nil {
		return err
	}
	m.KVHeads = m.Heads
	if c.boolKey(false, "multi_query_attention") {
		if m.KVHeads, err = c.requireInt("multi_query_group_num"); err != nil {
			return err
		}
	}
	if m.HeadDim, err = c.optInt(0, "kv_channels"); err != nil {
		return err
	}
	if m.HeadDim == 0 {
		if err := m.readHeadDim(c); err != nil {
			return err
		}
	}
	if m.Intermediate, err = c.optInt(4*m.Hidden, "ffn_hidden_size"); err != nil {
		return err
	}
	m.GatedMLP = true
	m.QKVBias = c.boolKey(true, "add_qkv_bias")
	m.TiedEmbeddings = c.boolKey(false, "tie_word_embeddings")
	return nil
}

// readMPT reads MPT and DBRX, which keep the KV head count in
// attn_config.kv_n_heads (absent: plain multi-head attention).
func (m *Model) readMPT(c hfConfig) error {
	if err := m.readCommon(c, []string{"n_layers", "num_hidden_layers"}, []string{"d_model", "hidden_size"}); err != nil {
		return err
	}
	var err error
	if m.Heads, err = c.requireInt("n_heads", "num_attention_heads"); err != nil {
		return err
	}
	m.KVHeads = m.Heads
	if ac := c.sub("attn_config"); ac != nil {
		if m.KVHeads, err = ac.optInt(m.Heads, "kv_n_heads"); err != nil {
			return err
		}
		if m.KVHeads == 0 {
			return &keyError{keys: []string{"attn_config.kv_n_heads"}, reason: "must be > 0"}
		}
	}
	if err := m.readHeadDim(c); err != nil {
		return err
	}
	if m.Family == FamilyDBRX {
		fc := c.sub("ffn_config")
		if fc == nil {
			m.lacksForWeights("ffn_config")
			fc = hfConfig{}
		}
		moe := &MoE{}
		if moe.ExpertIntermediate, err = fc.optInt(0, "ffn_hidden_size"); err != nil {
			return fmt.Errorf("ffn_config: %w", err)
		}
		if moe.ExpertIntermediate == 0 && c.sub("ffn_config") != nil {
			m.lacksForWeights("ffn_config.ffn_hidden_size")
		}
		if moe.Experts, err = fc.optInt(1, "moe_num_experts"); err != nil {
			return fmt.Errorf("ffn_config: %w", err)
		}
		m.MoE, m.GatedMLP, m.Intermediate = moe, true, moe.ExpertIntermediate
		m.TiedEmbeddings = c.boolKey(false, "tie_word_embeddings")
		return nil
	}
	ratio, err := c.floatKey(4, "expansion_ratio")
	if err != nil {
		return err
	}
	m.Intermediate = int(ratio * float64(m.Hidden))
	m.TiedEmbeddings = true // MPT has no separate LM head
	m.DenseBias = !c.boolKey(true, "no_bias")
	return nil
}

// readDeepSeek reads DeepSeek-V2/V3 multi-head latent attention. Without
// kv_lora_rank the model uses ordinary attention and the Llama rules apply.
func (m *Model) readDeepSeek(c hfConfig) error {
	if !c.has("kv_lora_rank") {
		m.Family = FamilyLlama
		return m.readLlama(c)
	}
	if err := m.readCommon(c, []string{"num_hidden_layers"}, []string{"hidden_size"}); err != nil {
		return err
	}
	var err error
	if m.Heads, err = c.requireInt("num_attention_heads"); err != nil {
		return err
	}
	mla := &MLA{}
	if mla.KVLoraRank, err = c.requireInt("kv_lora_rank"); err != nil {
		return err
	}
	if mla.QKRopeHeadDim, err = c.requireInt("qk_rope_head_dim"); err != nil {
		return err
	}
	if mla.QKNopeHeadDim, err = c.optInt(0, "qk_nope_head_dim"); err != nil {
		return err
	}
	if mla.VHeadDim, err = c.optInt(mla.QKNopeHeadDim, "v_head_dim"); err != nil {
		return err
	}
	if mla.QLoraRank, err = c.optInt(0, "q_lora_rank"); err != nil {
		return err
	}
	m.MLA = mla
	// The cache holds one latent per token and layer: vLLM treats it as one
	// KV head of size kv_lora_rank + qk_rope_head_dim.
	m.KVHeads, m.HeadDim = 1, mla.KVLoraRank+mla.QKRopeHeadDim
	if m.Intermediate, err = c.optInt(0, "intermediate_size"); err != nil {
		return err
	}
	if m.Intermediate == 0 {
		m.lacksForWeights("intermediate_size")
	}
	m.GatedMLP = true
	m.TiedEmbeddings = c.boolKey(false, "tie_word_embeddings")
	experts, err := c.optInt(0, "n_routed_experts")
	if err != nil || experts == 0 {
		return err
	}
	moe := &MoE{Experts: experts}
	if moe.ExpertIntermediate, err = c.optInt(0, "moe_intermediate_size"); err != nil {
		return err
	}
	if moe.ExpertIntermediate == 0 {
		m.lacksForWeights("moe_intermediate_size")
	}
	shared, err := c.optInt(0, "n_shared_experts")
	if err != nil {
		return err
	}
	moe.SharedIntermediate = shared * moe.ExpertIntermediate
	if moe.DenseLayers, err = c.optInt(0, "first_k_dense_replace"); err != nil {
		return err
	}
	m.MoE = moe
	return nil
}

// readQuant notes weight-only quantization (GPTQ, AWQ: bits) and FP8
// checkpoints, which change the weight bytes but not the KV cache.
func (m *Model) readQuant(c hfConfig) error {
	q := c.sub("quantization_config")
	if q == nil {
		return nil
	}
	bits, err := q.optInt(0, "bits", "w_bit", "weight_bits")
	if err != nil {
		return fmt.Errorf("quantization_config: %w", err)
	}
	if bits == 0 && strings.Contains(strings.ToLower(q.str("quant_method")), "fp8") {
		bits = 8
	}
	m.QuantBits = bits
	return nil
}

// check enforces what every family needs of its head counts.
func (m *Model) check() error {
	if m.MLA == nil && m.Heads%m.KVHeads != 0 {
		return fmt.Errorf("%d attention heads are not a multiple of %d KV heads", m.Heads, m.KVHeads)
	}
	if m.HeadDim <= 0 {
		return fmt.Errorf("head size must be > 0, got %d", m.HeadDim)
	}
	return nil
}
