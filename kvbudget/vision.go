package kvbudget

// DefaultMaxPixels is the largest image Qwen2-VL's processor accepts
// unless told otherwise (max_pixels = 16384 × 28 × 28): 16384 tokens.
const DefaultMaxPixels = 12845056

// readImageTokens reads the tokens of the model's largest image from a
// multimodal config (the wrapper's, before text_config is taken), so that
// an image is never counted below what the backend will put in the KV
// cache. 0: the config does not say (no vision tower, or one kvbudget does
// not know how to size).
//
//   - mm_tokens_per_image (Gemma 3): fixed.
//   - vision_config.spatial_merge_size (Qwen2-VL, Qwen2.5-VL): dynamic
//     resolution, max_pixels (the config's, else the processor's default)
//     over (patch_size × merge)².
//   - vision_config.image_size and patch_size (LLaVA, CLIP/SigLIP
//     towers): (image_size / patch_size)² a tile; with
//     image_grid_pinpoints (LLaVA-NeXT any-resolution) the largest grid's
//     tiles plus the base image, and a newline token per row.
func readImageTokens(c hfConfig) (int, error) {
	if n, err := c.optInt(0, "mm_tokens_per_image"); err != nil || n > 0 {
		return n, err
	}
	vc := c.sub("vision_config")
	if vc == nil {
		return 0, nil
	}
	patch, err := vc.optInt(0, "patch_size")
	if err != nil || patch == 0 {
		return 0, err
	}
	merge, err := vc.optInt(0, "spatial_merge_size")
	if err != nil {
		return 0, err
	}
	if merge > 0 {
		px, err := vc.optInt(0, "max_pixels")
		if err != nil {
			return 0, err
		}
		if px == 0 {
			if px, err = c.optInt(DefaultMaxPixels, "max_pixels"); err != nil {
				return 0, err
			}
		}
		unit := patch * merge
		return (px + unit*unit - 1) / (unit * unit), nil
	}
	size, err := vc.optInt(0, "image_size")
	if err != nil || size == 0 {
		return 0, err
	}
	side := (size + patch - 1) / patch
	tile := side * side
	tiles, rows := 1, 0
	if grid, ok := c["image_grid_pinpoints"].([]any); ok {
		most := 0
		for _, g := range grid {
			wh, ok := g.([]any)
			if !ok || len(wh) != 2 {
				continue
			}
			w, h := pinpoint(wh[0]), pinpoint(wh[1])
			cells := ((w + size - 1) / size) * ((h + size - 1) / size)
			if cells > most {
				most, rows = cells, ((h+size-1)/size)*side
			}
		}
		tiles += most
	}
	return tiles*tile + rows, nil
}

func pinpoint(v any) int {
	if n, ok := v.(interface{ Int64() (int64, error) }); ok {
		i, err := n.Int64()
		if err == nil && i > 0 && i < 1<<20 {
			return int(i)
		}
	}
	return 0
}
