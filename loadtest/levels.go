package loadtest

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// MaxConcurrency bounds one closed-loop level; beyond it the client, not the
// target, would be what is measured.
const MaxConcurrency = 100_000

// MaxRate bounds one open-loop level, in requests per second.
const MaxRate = 100_000.0

// maxLevels bounds how many steps a list may expand to.
const maxLevels = 1000

// ParseConcurrency reads a list of concurrency levels: comma-separated
// items, each a number N, a doubling-style range A..BxF (A, A·F, A·F², … up
// to B, rounded up to whole requests and always rising) or an arithmetic
// range A..B+S (A, A+S, … up to B; A..B alone steps by 1). The result is
// sorted ascending without repeats, e.g. "1..256x2" is 1,2,4,…,256.
func ParseConcurrency(s string) ([]int, error) {
	fs, err := parseLevels(s, true, MaxConcurrency)
	if err != nil {
		return nil, err
	}
	out := make([]int, len(fs))
	for i, f := range fs {
		out[i] = int(f)
	}
	return out, nil
}

// ParseRates reads a list of request rates (requests per second) with the
// same grammar as ParseConcurrency, e.g. "1,2,5,10" or "0.5..8x2".
func ParseRates(s string) ([]float64, error) {
	return parseLevels(s, false, MaxRate)
}

func parseLevels(s string, integer bool, maxLevel float64) ([]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty list; want e.g. 1,2,4,8 or 1..256x2")
	}
	var out []float64
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("%q: empty item between commas", s)
		}
		lo, rest, isRange := strings.Cut(item, "..")
		if !isRange {
			v, err := parseLevel(item, integer, maxLevel)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			continue
		}
		a, err := parseLevel(lo, integer, maxLevel)
		if err != nil {
			return nil, fmt.Errorf("%q: start: %w", item, err)
		}
		hiStr, op, step := rest, byte('+'), "1"
		if i := strings.IndexAny(rest, "x*+"); i >= 0 {
			hiStr, op, step = rest[:i], rest[i], rest[i+1:]
		}
		b, err := parseLevel(hiStr, integer, maxLevel)
		if err != nil {
			return nil, fmt.Errorf("%q: end: %w", item, err)
		}
		if a > b {
			return nil, fmt.Errorf("%q: start %s is above end %s", item, fmtNum(a), fmtNum(b))
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(step), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%q: step %q is not a number", item, step)
		}
		switch op {
		case '+':
			if f <= 0 || (integer && f != math.Trunc(f)) {
				return nil, fmt.Errorf("%q: +STEP must be a positive %s, got %s", item, kindOf(integer), step)
			}
		default:
			if f <= 1 {
				return nil, fmt.Errorf("%q: xFACTOR must be greater than 1, got %s", item, step)
			}
		}
		for v := a; v <= b*(1+1e-9); {
			if len(out) >= maxLevels {
				return nil, fmt.Errorf("%q: more than %d levels", s, maxLevels)
			}
			if !integer {
				v = math.Round(v*1e6) / 1e6 // 0.1+0.2 is 0.3 here
			}
			out = append(out, v)
			next := v + f
			if op != '+' {
				next = v * f
			}
			if integer {
				next = max(math.Ceil(next-1e-9), v+1)
			}
			v = next
		}
	}
	if len(out) > maxLevels {
		return nil, fmt.Errorf("%q: more than %d levels", s, maxLevels)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func parseLevel(s string, integer bool, maxLevel float64) (float64, error) {
	s = strings.TrimSpace(s)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	if integer && v != math.Trunc(v) {
		return 0, fmt.Errorf("%q is not a whole number of concurrent requests", s)
	}
	if v <= 0 || (integer && v < 1) {
		return 0, fmt.Errorf("%q must be positive", s)
	}
	if !integer && v < 0.001 {
		return 0, fmt.Errorf("%q is below the minimum 0.001", s)
	}
	if v > maxLevel {
		return 0, fmt.Errorf("%q is above the maximum %s", s, fmtNum(maxLevel))
	}
	return v, nil
}

func kindOf(integer bool) string {
	if integer {
		return "whole number"
	}
	return "number"
}
