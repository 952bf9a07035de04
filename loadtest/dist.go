package loadtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
)

// MaxLength caps every sampled length, in tokens. No served model has a
// context near it; the cap keeps a wild lognormal tail or a typo from
// building gigabyte prompts.
const MaxLength = 1 << 21

// maxFileLengths bounds a file: of lengths, so a wrong path (a log file, a
// dataset) fails fast instead of filling memory.
const maxFileLengths = 10_000_000

// Dist is a distribution of token lengths. Sample never returns less than 1
// or more than MaxLength; String gives back a spec that parses to the same
// distribution (for a file, its path).
type Dist interface {
	Sample(r *rand.Rand) int
	String() string
}

// ParseDist reads a length distribution:
//
//	fixed:N              every request N tokens (a bare N means the same)
//	uniform:A-B          integers A..B inclusive, equally likely
//	normal:MEAN,SD       rounded normal; values below 1 are redrawn
//	lognormal:MEDIAN,SIGMA  exp(ln MEDIAN + SIGMA·Z), rounded; long right tail
//	file:PATH            the empirical distribution of a file holding one
//	                     length a line (blank lines and # comments skipped)
//
// readFile reads PATH for file:; nil means os.ReadFile. Errors quote the spec
// and say what is wrong with it; callers add the flag name.
func ParseDist(spec string, readFile func(string) ([]byte, error)) (Dist, error) {
	if readFile == nil {
		readFile = os.ReadFile
	}
	s := strings.TrimSpace(spec)
	if s == "" {
		return nil, errors.New("empty distribution; want fixed:N, uniform:A-B, normal:MEAN,SD, lognormal:MEDIAN,SIGMA or file:PATH")
	}
	kind, arg, hasColon := strings.Cut(s, ":")
	if !hasColon {
		if _, err := strconv.Atoi(s); err != nil {
			return nil, fmt.Errorf("%q: want fixed:N, uniform:A-B, normal:MEAN,SD, lognormal:MEDIAN,SIGMA or file:PATH", spec)
		}
		kind, arg = "fixed", s
	}
	switch strings.ToLower(kind) {
	case "fixed":
		n, err := parseLength(arg)
		if err != nil {
			return nil, fmt.Errorf("%q: fixed:N: %w", spec, err)
		}
		return fixed(n), nil
	case "uniform":
		a, b, ok := strings.Cut(arg, "-")
		if !ok {
			return nil, fmt.Errorf("%q: uniform:A-B: want two lengths joined by '-', e.g. uniform:128-1024", spec)
		}
		lo, err := parseLength(a)
		if err != nil {
			return nil, fmt.Errorf("%q: uniform:A-B: A: %w", spec, err)
		}
		hi, err := parseLength(b)
		if err != nil {
			return nil, fmt.Errorf("%q: uniform:A-B: B: %w", spec, err)
		}
		if lo > hi {
			return nil, fmt.Errorf("%q: uniform:A-B: A (%d) is greater than B (%d)", spec, lo, hi)
		}
		return uniform{lo, hi}, nil
	case "normal":
		mean, sd, err := twoFloats(arg)
		if err != nil {
			return nil, fmt.Errorf("%q: normal:MEAN,SD: %w", spec, err)
		}
		if mean < 1 || mean > MaxLength {
			return nil, fmt.Errorf("%q: normal:MEAN,SD: MEAN must be in [1, %d], got %g", spec, MaxLength, mean)
		}
		if sd < 0 || sd > MaxLength {
			return nil, fmt.Errorf("%q: normal:MEAN,SD: SD must be in [0, %d], got %g", spec, MaxLength, sd)
		}
		return normal{mean, sd}, nil
	case "lognormal":
		median, sigma, err := twoFloats(arg)
		if err != nil {
			return nil, fmt.Errorf("%q: lognormal:MEDIAN,SIGMA: %w", spec, err)
		}
		if median < 1 || median > MaxLength {
			return nil, fmt.Errorf("%q: lognormal:MEDIAN,SIGMA: MEDIAN must be in [1, %d], got %g", spec, MaxLength, median)
		}
		if sigma < 0 || sigma > 10 {
			return nil, fmt.Errorf("%q: lognormal:MEDIAN,SIGMA: SIGMA must be in [0, 10], got %g", spec, sigma)
		}
		return lognormal{median, sigma}, nil
	case "file":
		if arg == "" {
			return nil, fmt.Errorf("%q: file:PATH: empty path", spec)
		}
		data, err := readFile(arg)
		if err != nil {
			return nil, fmt.Errorf("%q: file:PATH: %w", spec, err)
		}
		lens, err := parseLengthFile(data)
		if err != nil {
			return nil, fmt.Errorf("%q: file:PATH: %s: %w", spec, arg, err)
		}
		return empirical{path: arg, lens: lens}, nil
	}
	return nil, fmt.Errorf("%q: unknown distribution %q; want fixed, uniform, normal, lognormal or file", spec, kind)
}

func parseLength(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a whole number of tokens", s)
	}
	if n < 1 || n > MaxLength {
		return 0, fmt.Errorf("length must be in [1, %d], got %d", MaxLength, n)
	}
	return n, nil
}

func twoFloats(s string) (float64, float64, error) {
	a, b, ok := strings.Cut(s, ",")
	if !ok {
		return 0, 0, fmt.Errorf("want two numbers joined by ',', got %q", s)
	}
	x, err := strconv.ParseFloat(strings.TrimSpace(a), 64)
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		return 0, 0, fmt.Errorf("%q is not a number", a)
	}
	y, err := strconv.ParseFloat(strings.TrimSpace(b), 64)
	if err != nil || math.IsNaN(y) || math.IsInf(y, 0) {
		return 0, 0, fmt.Errorf("%q is not a number", b)
	}
	return x, y, nil
}

func parseLengthFile(data []byte) ([]int, error) {
	var lens []int
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		n, err := parseLength(t)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if len(lens) >= maxFileLengths {
			return nil, fmt.Errorf("more than %d lengths", maxFileLengths)
		}
		lens = append(lens, n)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	if len(lens) == 0 {
		return nil, errors.New("no lengths in the file (one whole number a line)")
	}
	return lens, nil
}

func clampLength(x float64) int {
	return int(min(max(math.Round(x), 1), MaxLength))
}

type fixed int

func (f fixed) Sample(*rand.Rand) int { return int(f) }
func (f fixed) String() string        { return fmt.Sprintf("fixed:%d", int(f)) }

type uniform struct{ lo, hi int }

func (u uniform) Sample(r *rand.Rand) int { return u.lo + r.IntN(u.hi-u.lo+1) }
func (u uniform) String() string          { return fmt.Sprintf("uniform:%d-%d", u.lo, u.hi) }

type normal struct{ mean, sd float64 }

// Sample redraws values that round below 1 (a truncated normal) rather than
// piling them up at 1; after a few misses (a mean near 1 with a huge SD) it
// settles for 1 so it always returns.
func (d normal) Sample(r *rand.Rand) int {
	for range 16 {
		if x := math.Round(d.mean + d.sd*r.NormFloat64()); x >= 1 {
			return clampLength(x)
		}
	}
	return 1
}
func (d normal) String() string { return "normal:" + fmtNum(d.mean) + "," + fmtNum(d.sd) }

type lognormal struct{ median, sigma float64 }

func (d lognormal) Sample(r *rand.Rand) int {
	return clampLength(math.Exp(math.Log(d.median) + d.sigma*r.NormFloat64()))
}
func (d lognormal) String() string { return "lognormal:" + fmtNum(d.median) + "," + fmtNum(d.sigma) }

type empirical struct {
	path string
	lens []int
}

func (e empirical) Sample(r *rand.Rand) int { return e.lens[r.IntN(len(e.lens))] }
func (e empirical) String() string          { return "file:" + e.path }

func fmtNum(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
