package kvbudget

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestBlocks(t *testing.T) {
	tests := []struct {
		tokens, bs int
		want       int64
	}{
		{0, 16, 0}, {-3, 16, 0}, {1, 16, 1}, {15, 16, 1}, {16, 16, 1}, {17, 16, 2}, {32, 16, 2}, {33, 16, 3}, {8192, 16, 512}, {100, 32, 4},
	}
	for _, tt := range tests {
		if got := Blocks(tt.tokens, tt.bs); got != tt.want {
			t.Errorf("Blocks(%d, %d) = %d, want %d", tt.tokens, tt.bs, got, tt.want)
		}
	}
}

func TestRequestBlocks(t *testing.T) {
	l := KVLayout{BlockSize: 16, BytesPerBlock: 1000}
	tests := []struct {
		prompt, output, n int
		want              int64
	}{
		{10, 6, 1, 1},        // 16 tokens: one block
		{10, 7, 1, 2},        // 17 tokens: two
		{16, 16, 1, 2},       // exactly two blocks
		{32, 1, 2, 2 + 2},    // two shared prompt blocks, each sample one of its own
		{20, 12, 3, 1 + 3*1}, // one full shared block; 20+12=32 -> 2 blocks, 1 own each
		{20, 13, 3, 1 + 3*2},
		{0, 5, 1, 1},
		{5, 0, 1, 1},
		{5, 5, 0, 1}, // n<1 treated as 1
	}
	for _, tt := range tests {
		if got := l.RequestBlocks(tt.prompt, tt.output, tt.n); got != tt.want {
			t.Errorf("RequestBlocks(%d, %d, %d) = %d, want %d", tt.prompt, tt.output, tt.n, got, tt.want)
		}
		if got := l.RequestBytes(tt.prompt, tt.output, tt.n); got != tt.want*1000 {
			t.Errorf("RequestBytes(%d, %d, %d) = %d", tt.prompt, tt.output, tt.n, got)
		}
	}
}

// GroupBlocks is the one formula: shared prompt blocks held elsewhere are
// not counted again, never below nothing, and sizes saturate rather than
// wrap.
func TestGroupBlocks(t *testing.T) {
	tests := []struct {
		name                  string
		prompt, output, n, bs int
		held                  int64
		want                  int64
	}{
		{"plain", 40, 8, 1, 16, 0, 3},
		{"two full prompt blocks held elsewhere", 40, 8, 1, 16, 2, 1},
		{"held counts only the prompt's full blocks", 40, 8, 1, 16, 9, 1},
		{"negative held is nothing", 40, 8, 1, 16, -3, 3},
		{"shared between sequences and held", 40, 8, 3, 16, 1, 1 + 3*1},
		{"negative sizes are empty", -5, -5, 1, 16, 0, 0},
		{"output past int saturates", 16, math.MaxInt, 32, 16, 0, math.MaxInt64},
		{"many sequences saturate", 16, 1 << 40, math.MaxInt32, 1, 0, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := GroupBlocks(tt.prompt, tt.output, tt.n, tt.bs, tt.held); got != tt.want {
			t.Errorf("%s: GroupBlocks(%d, %d, %d, %d, %d) = %d, want %d", tt.name, tt.prompt, tt.output, tt.n, tt.bs, tt.held, got, tt.want)
		}
	}
	l := KVLayout{BlockSize: 16, BytesPerBlock: 1 << 40}
	if got := l.GroupBytes(16, 1<<40, 1<<20, 0); got != math.MaxInt64 {
		t.Errorf("GroupBytes of a huge request = %d, want it saturated", got)
	}
}

// Llama-3-8B (bf16, 16,060,522,496 weight bytes) on a 24 GiB GPU at 0.75
// with 1 GiB reserve: 19,327,352,832 − 16,060,522,496 − 1,073,741,824 =
// 2,193,088,512 bytes; at 2 MiB a block, 1045 blocks, 16,720 tokens, two
// sequences of 8192.
func TestBudgetLlama3On24GiB(t *testing.T) {
	m := loadTestModel(t, "meta-llama-3-8b")
	l, err := m.KVLayout(KVSpec{})
	if err != nil {
		t.Fatal(err)
	}
	g := GPUBudget{Memory: 24 << 30, Ceiling: 0.75, Weights: m.WeightBytes(m.ServedDType()), Reserve: DefaultReserve}
	kv, err := g.KVBytes()
	if err != nil {
		t.Fatal(err)
	}
	if kv != 2193088512 {
		t.Errorf("kv bytes = %d, want 2193088512", kv)
	}
	c := l.CapacityOf(kv)
	if c.Blocks != 1045 || c.Tokens != 16720 {
		t.Errorf("capacity = %+v, want 1045 blocks, 16720 tokens", c)
	}
	if got := l.MaxConcurrency(c, 8192); got != 2 {
		t.Errorf("max concurrency at 8192 = %d, want 2", got)
	}
	if got := l.MaxConcurrency(c, 1000); got != 16 { // 63 blocks each
		t.Errorf("max concurrency at 1000 = %d, want 16", got)
	}
}

func TestBudgetErrors(t *testing.T) {
	tests := []struct {
		g       GPUBudget
		wantErr string
		noFit   bool
	}{
		{GPUBudget{Memory: 16 << 30, Ceiling: 0.75, Weights: 15 << 30}, "weights do not fit", true},
		{GPUBudget{Memory: 24 << 30, Ceiling: 0.75, Weights: 14 << 30, Reserve: 1 << 30, OtherUsed: 3 << 30}, "weights do not fit", true},
		{GPUBudget{Memory: 0, Ceiling: 0.75}, "gpu memory must be > 0", false},
		{GPUBudget{Memory: -1, Ceiling: 0.75}, "gpu memory must be > 0", false},
		{GPUBudget{Memory: 1 << 30, Ceiling: 0}, "ceiling must be in (0, 1]", false},
		{GPUBudget{Memory: 1 << 30, Ceiling: 1.2}, "ceiling must be in (0, 1]", false},
		{GPUBudget{Memory: 1 << 30, Ceiling: 0.5, Reserve: -1}, "must be >= 0", false},
	}
	for _, tt := range tests {
		_, err := tt.g.KVBytes()
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%+v: err = %v, want %q", tt.g, err, tt.wantErr)
			continue
		}
		if errors.Is(err, ErrWeightsDoNotFit) != tt.noFit {
			t.Errorf("%+v: errors.Is(ErrWeightsDoNotFit) = %v", tt.g, !tt.noFit)
		}
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		unit    string
		wantErr string
	}{
		{"80GiB", 80 << 30, "GiB", ""},
		{"80GB", 80e9, "GB (10^9)", ""},
		{"24G", 24 << 30, "GiB", ""},
		{"24g", 24 << 30, "GiB", ""},
		{"24Gi", 24 << 30, "GiB", ""},
		{"1.5GiB", 3 << 29, "GiB", ""},
		{"512MiB", 512 << 20, "MiB", ""},
		{"512 MB", 512e6, "MB", ""},
		{"1TiB", 1 << 40, "TiB", ""},
		{"1073741824", 1 << 30, "bytes", ""},
		{"100B", 100, "bytes", ""},
		{"-1GiB", 0, "", "negative"},
		{"", 0, "", "empty"},
		{"lots", 0, "", "invalid memory size"},
		{"12XB", 0, "", "invalid memory size"},
		{"NaNGiB", 0, "", "invalid memory size"},
		{"1e30GiB", 0, "", "too large"},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseSize(%q) err = %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got.Bytes != tt.want || !strings.Contains(got.Unit, tt.unit) {
			t.Errorf("ParseSize(%q) = %+v, %v; want %d in %s", tt.in, got, err, tt.want, tt.unit)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {3 << 29, "1.5 GiB"}, {-(2 << 30), "-2.0 GiB"},
	}
	for _, tt := range tests {
		if got := FormatBytes(tt.in); got != tt.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestResolveKVDType(t *testing.T) {
	tests := []struct {
		choice string
		model  DType
		want   DType
	}{
		{"", BFloat16, BFloat16}, {"auto", Float16, Float16}, {"auto", Float32, Float16}, {"AUTO", "", Float16},
		{"fp8", BFloat16, FP8}, {"float32", BFloat16, Float32}, {"bf16", Float16, BFloat16}, {"torch.float16", BFloat16, Float16},
	}
	for _, tt := range tests {
		got, err := ResolveKVDType(tt.choice, tt.model)
		if err != nil || got != tt.want {
			t.Errorf("ResolveKVDType(%q, %s) = %s, %v; want %s", tt.choice, tt.model, got, err, tt.want)
		}
	}
}

// Issue 12, item 10: a GPU's memory without a unit is refused, never read
// as bytes.
func TestParseMemory(t *testing.T) {
	for _, in := range []string{"24", "24.", "24.5", " 80 ", "1e3"} {
		if _, err := ParseMemory(in); err == nil || !strings.Contains(err.Error(), "has no unit") {
			t.Errorf("ParseMemory(%q) err = %v", in, err)
		}
	}
	for in, want := range map[string]int64{"24GiB": 24 << 30, "24G": 24 << 30, "80GB": 80e9, "25769803776B": 24 << 30} {
		if got, err := ParseMemory(in); err != nil || got.Bytes != want {
			t.Errorf("ParseMemory(%q) = %d, %v", in, got.Bytes, err)
		}
	}
}

func TestDecodeBound(t *testing.T) {
	// Llama-3-8B on an A100 80GB: 16 GB of weights and 32 sequences of
	// 4096 tokens × 128 KiB: a step reads 16e9 + 32 × 536,870,912 bytes
	// (33.2 GB) at 2.039e12 B/s, 16.3 ms, for 32 tokens.
	got := DecodeBound(2039e9, 16e9, 4096*131072, 32)
	want := 32 / ((16e9 + 32*4096*131072) / 2039e9)
	if got != want || got < 1960 || got > 1970 {
		t.Errorf("DecodeBound = %g, want %g (about 1966 tok/s)", got, want)
	}
	for _, tc := range []struct {
		bw          float64
		w, kv, seqs int64
		want        float64
	}{{1e12, 1e9, 0, 0, 0}, {0, 1e9, 1e6, 4, 0}, {1e12, 1e9, 0, 10, 1e4}} {
		if got := DecodeBound(tc.bw, tc.w, tc.kv, tc.seqs); got != tc.want {
			t.Errorf("DecodeBound(%g, %d, %d, %d) = %g, want %g", tc.bw, tc.w, tc.kv, tc.seqs, got, tc.want)
		}
	}
	// More sequences never lower the bound, and more bandwidth raises it.
	if DecodeBound(1e12, 1e9, 1e6, 8) <= DecodeBound(1e12, 1e9, 1e6, 4) || DecodeBound(2e12, 1e9, 1e6, 4) <= DecodeBound(1e12, 1e9, 1e6, 4) {
		t.Error("DecodeBound is not monotonic")
	}
}
