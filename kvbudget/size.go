package kvbudget

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Size is a parsed memory size and how its unit was read, so tools can say
// which reading they took ("24G" is binary; "24GB" is decimal).
type Size struct {
	Bytes int64
	Unit  string // the unit as understood, e.g. "GiB (2^30)"
}

var sizeUnits = []struct {
	suffix string
	mult   float64
	desc   string
}{
	{"kib", 1 << 10, "KiB (2^10)"}, {"mib", 1 << 20, "MiB (2^20)"}, {"gib", 1 << 30, "GiB (2^30)"}, {"tib", 1 << 40, "TiB (2^40)"},
	{"kb", 1e3, "kB (10^3)"}, {"mb", 1e6, "MB (10^6)"}, {"gb", 1e9, "GB (10^9)"}, {"tb", 1e12, "TB (10^12)"},
	// A bare letter is read as binary, as nvidia-smi, free -g and GPU spec
	// sheets mean it.
	{"ki", 1 << 10, "KiB (2^10)"}, {"mi", 1 << 20, "MiB (2^20)"}, {"gi", 1 << 30, "GiB (2^30)"}, {"ti", 1 << 40, "TiB (2^40)"},
	{"k", 1 << 10, "KiB (2^10)"}, {"m", 1 << 20, "MiB (2^20)"}, {"g", 1 << 30, "GiB (2^30)"}, {"t", 1 << 40, "TiB (2^40)"},
	{"b", 1, "bytes"},
}

// ParseSize reads a memory size: "80GiB", "80GB", "24G", "512MiB", "1.5GiB" or
// a plain byte count. Negative, fractional-byte and overflowing sizes are
// errors.
func ParseSize(s string) (Size, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return Size{}, fmt.Errorf("empty memory size")
	}
	mult, desc := 1.0, "bytes"
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult, desc = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult, u.desc
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return Size{}, fmt.Errorf("invalid memory size %q (want e.g. 80GiB, 80GB, 24G or a byte count)", s)
	}
	if v < 0 {
		return Size{}, fmt.Errorf("memory size %q is negative", s)
	}
	b := v * mult
	if b >= math.MaxInt64 {
		return Size{}, fmt.Errorf("memory size %q is too large", s)
	}
	return Size{Bytes: int64(math.Round(b)), Unit: desc}, nil
}

// ParseMemory reads the memory of a GPU as ParseSize does, but refuses a
// bare number: "24" is far more likely 24 GiB than 24 bytes, and neither
// reading should be guessed. Bytes are written with a B ("25769803776B").
func ParseMemory(s string) (Size, error) {
	t := strings.TrimSpace(s)
	if t != "" && (t[len(t)-1] == '.' || t[len(t)-1] >= '0' && t[len(t)-1] <= '9') {
		return Size{}, fmt.Errorf("memory size %q has no unit: write %sGiB (binary) or %sGB (decimal), or %sB for bytes", s, t, t, t)
	}
	return ParseSize(s)
}

// FormatBytes renders n in binary units with one decimal ("14.9 GiB").
func FormatBytes(n int64) string {
	neg := n < 0
	u := float64(n)
	if neg {
		u = -u
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	i := 0
	for u >= 1024 && i < len(units)-1 {
		u /= 1024
		i++
	}
	sign := ""
	if neg {
		sign = "-"
	}
	if i == 0 {
		return fmt.Sprintf("%s%d B", sign, int64(u))
	}
	return fmt.Sprintf("%s%.1f %s", sign, u, units[i])
}
