package kvbudget

import "testing"

func TestImageTokens(t *testing.T) {
	const text = `"text_config":{"model_type":"llama","num_hidden_layers":2,"hidden_size":64,"num_attention_heads":4,"num_key_value_heads":4,"intermediate_size":128,"vocab_size":100,"torch_dtype":"bfloat16"}`
	for _, tc := range []struct {
		name, config string
		want         int
	}{
		{"text only", `{` + text + `}`, 0},
		{"gemma 3", `{"mm_tokens_per_image":256,` + text + `}`, 256},
		{"qwen2-vl default", `{"vision_config":{"patch_size":14,"spatial_merge_size":2},` + text + `}`, 16384},
		{"qwen2-vl max_pixels", `{"max_pixels":1003520,"vision_config":{"patch_size":14,"spatial_merge_size":2},` + text + `}`, 1280},
		{"llava", `{"vision_config":{"image_size":336,"patch_size":14},` + text + `}`, 576},
		{"llava-next", `{"image_grid_pinpoints":[[336,672],[672,336],[672,672],[1008,336]],"vision_config":{"image_size":336,"patch_size":14},` + text + `}`, 5*576 + 2*24},
		{"no patch size", `{"vision_config":{"image_size":336},` + text + `}`, 0},
	} {
		m, err := ParseModelConfig([]byte(tc.config))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if m.ImageTokens != tc.want {
			t.Errorf("%s: %d image tokens, want %d", tc.name, m.ImageTokens, tc.want)
		}
	}
	if _, err := ParseModelConfig([]byte(`{"vision_config":{"patch_size":"x"},` + text + `}`)); err == nil {
		t.Error("a patch_size that is not a number was accepted")
	}
}
