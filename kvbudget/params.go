package kvbudget

// Params is an estimate of a model's parameter count, split by how the
// weights are stored: quantization touches the linear layers only.
type Params struct {
	Embedding int64 // token (and learned position) embeddings, and an untied LM head
	Linear    int64 // attention and MLP matrices, experts and routers included
	Other     int64 // norms and biases
}

// Total is the parameter count.
func (p Params) Total() int64 { return p.Embedding + p.Linear + p.Other }

// EstimateParams counts the parameters of m from its shapes. It is exact for
// the architectures kvbudget models (to the bias) and within a few percent for
// the rest; ops who know better pass a weight byte count instead.
func (m *Model) EstimateParams() Params {
	h, L := int64(m.Hidden), int64(m.Layers)
	var p Params

	p.Embedding = int64(m.Vocab)*h + int64(m.LearnedPositions)*h
	if !m.TiedEmbeddings {
		p.Embedding += int64(m.Vocab) * h
	}

	attn, attnBias := m.attentionParams()
	mlpMats := int64(2)
	if m.GatedMLP {
		mlpMats = 3
	}
	dense := mlpMats * h * int64(m.Intermediate)
	var denseBias int64
	if m.DenseBias {
		denseBias = (mlpMats-1)*int64(m.Intermediate) + h
	}

	moeLayers, denseLayers := int64(0), L
	var moe int64
	if m.MoE != nil {
		moeLayers = L - int64(m.MoE.DenseLayers)
		denseLayers = int64(m.MoE.DenseLayers)
		moe = int64(m.MoE.Experts)*mlpMats*h*int64(m.MoE.ExpertIntermediate) +
			mlpMats*h*int64(m.MoE.SharedIntermediate) +
			h*int64(m.MoE.Experts) // router
	}

	p.Linear = L*attn + denseLayers*dense + moeLayers*moe
	norms := 2 * h // two norms per layer
	if m.DenseBias {
		norms *= 2 // LayerNorm has a bias too
	}
	p.Other = L*(attnBias+norms) + denseLayers*denseBias + h // + final norm
	return p
}

// attentionParams is one layer's attention matrices and their biases.
func (m *Model) attentionParams() (mats, bias int64) {
	h := int64(m.Hidden)
	if a := m.MLA; a != nil {
		heads := int64(m.Heads)
		qk := int64(a.QKNopeHeadDim + a.QKRopeHeadDim)
		if a.QLoraRank > 0 {
			mats += h*int64(a.QLoraRank) + int64(a.QLoraRank)*heads*qk
			bias += int64(a.QLoraRank) // q_a_layernorm
		} else {
			mats += h * heads * qk
		}
		mats += h * int64(a.KVLoraRank+a.QKRopeHeadDim)                         // kv_a_proj_with_mqa
		mats += int64(a.KVLoraRank) * heads * int64(a.QKNopeHeadDim+a.VHeadDim) // kv_b_proj
		mats += heads * int64(a.VHeadDim) * h                                   // o_proj
		bias += int64(a.KVLoraRank)                                             // kv_a_layernorm
		return mats, bias
	}
	q := int64(m.Heads * m.HeadDim)
	kv := int64(m.KVHeads * m.HeadDim)
	mats = h*q + 2*h*kv + q*h
	if m.QKVBias || m.DenseBias {
		bias = q + 2*kv
	}
	if m.DenseBias {
		bias += h
	}
	return mats, bias
}

// WeightBytes estimates the bytes the weights take on GPU when served in
// dtype: linear layers at QuantBits when the checkpoint is quantized, the
// rest at dtype's width.
func (m *Model) WeightBytes(dtype DType) int64 {
	p := m.EstimateParams()
	w := int64(dtype.Bytes())
	linear := p.Linear * w
	if m.QuantBits > 0 {
		linear = p.Linear * int64(m.QuantBits) / 8
	}
	return linear + (p.Embedding+p.Other)*w
}

// ServedDType is the dtype vLLM's "auto" serves the weights in: the
// checkpoint's, with float32 served as float16.
func (m *Model) ServedDType() DType {
	d, _ := ResolveKVDType("auto", m.DType)
	return d
}
