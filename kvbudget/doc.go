// Package kvbudget is the KV-cache arithmetic of kvgate: how many bytes one
// token, one block and one request occupy on one GPU, and how many of them fit
// in what a GPU has left once the weights and the runtime are paid for.
//
// The model is vLLM's. A model's geometry (layers, KV heads, head size, KV
// dtype) is read from its Hugging Face config.json with the same key rules
// vLLM applies to each family; tensor parallelism splits the KV heads across
// GPUs but never below one head per GPU; a sequence holds whole blocks of
// BlockSize tokens, so its cost is ceil(tokens/BlockSize) blocks.
//
// Invariants: every function is pure (no I/O, no clocks, no globals; callers
// hand in bytes or an fs.FS), sizes are int64 bytes, and a value that cannot be
// computed is an error naming the config key or argument at fault, never a
// silent zero.
package kvbudget
