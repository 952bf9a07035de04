package sim

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// mix is SplitMix64's finaliser: a bijective, well-spread hash of x. Every
// random choice the simulator makes is mix of a key derived from the seed and
// the request's content, so it does not depend on arrival order.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// unit maps a key to a float in [0, 1).
func unit(key uint64) float64 { return float64(mix(key)>>11) / (1 << 53) }

// Salts that keep the draws made from one key independent of each other.
const (
	saltLen1 uint64 = 0x6c656e31 // "len1"
	saltLen2 uint64 = 0x6c656e32
	saltText uint64 = 0x74657874
)

type distKind uint8

const (
	distMax distKind = iota // always max_tokens
	distFixed
	distUniform
	distNormal
	distLognormal
)

// lengthRule is a parsed OutputLenWhen entry.
type lengthRule struct {
	text []byte
	dist lengthDist
}

// lengthsFor is the distribution a request's body draws its lengths from:
// the first OutputLenWhen rule whose text it contains, or nil for OutputLen.
func (s *settings) lengthsFor(body []byte) *lengthDist {
	for i := range s.outputWhen {
		if bytes.Contains(body, s.outputWhen[i].text) {
			return &s.outputWhen[i].dist
		}
	}
	return nil
}

// lengthDist is a parsed OutputLen: how long a sequence wants to be before
// max_tokens caps it.
type lengthDist struct {
	kind distKind
	a, b float64
	text string
}

func (d lengthDist) String() string {
	if d.kind == distMax {
		return "max_tokens"
	}
	return d.text
}

// parseLengthDist reads "", "fixed:N", "uniform:A-B", "normal:MEAN,STDDEV"
// or "lognormal:MEDIAN,SIGMA".
func parseLengthDist(s string) (lengthDist, error) {
	if s == "" || s == "max" {
		return lengthDist{kind: distMax}, nil
	}
	kind, arg, ok := strings.Cut(s, ":")
	if !ok {
		return lengthDist{}, fmt.Errorf("invalid length distribution %q (want fixed:N, uniform:A-B, normal:MEAN,STDDEV or lognormal:MEDIAN,SIGMA)", s)
	}
	num := func(v string) (float64, error) {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			return 0, fmt.Errorf("invalid length distribution %q: %q is not a non-negative number", s, v)
		}
		return f, nil
	}
	two := func(sep string) (float64, float64, error) {
		x, y, ok := strings.Cut(arg, sep)
		if !ok {
			return 0, 0, fmt.Errorf("invalid length distribution %q: want two numbers separated by %q", s, sep)
		}
		a, err := num(x)
		if err != nil {
			return 0, 0, err
		}
		b, err := num(y)
		return a, b, err
	}
	d := lengthDist{text: s}
	var err error
	switch kind {
	case "fixed":
		d.kind = distFixed
		d.a, err = num(arg)
		if err == nil && (d.a < 1 || d.a != math.Trunc(d.a)) {
			err = fmt.Errorf("invalid length distribution %q: N must be a whole number >= 1", s)
		}
	case "uniform":
		d.kind = distUniform
		d.a, d.b, err = two("-")
		if err == nil && (d.a < 1 || d.b < d.a || d.a != math.Trunc(d.a) || d.b != math.Trunc(d.b)) {
			err = fmt.Errorf("invalid length distribution %q: want whole numbers 1 <= A <= B", s)
		}
	case "normal":
		d.kind = distNormal
		d.a, d.b, err = two(",")
		if err == nil && d.a < 1 {
			err = fmt.Errorf("invalid length distribution %q: MEAN must be >= 1", s)
		}
	case "lognormal":
		d.kind = distLognormal
		d.a, d.b, err = two(",")
		if err == nil && d.a < 1 {
			err = fmt.Errorf("invalid length distribution %q: MEDIAN must be >= 1", s)
		}
	default:
		err = fmt.Errorf("invalid length distribution %q: unknown kind %q (want fixed, uniform, normal or lognormal)", s, kind)
	}
	if err != nil {
		return lengthDist{}, err
	}
	return d, nil
}

// draw is the output length of the sequence with this key, in [1, max].
func (d lengthDist) draw(key uint64, max int) int {
	var v float64
	switch d.kind {
	case distMax:
		return max
	case distFixed:
		v = d.a
	case distUniform:
		v = d.a + math.Floor(unit(key^saltLen1)*(d.b-d.a+1))
	case distNormal, distLognormal:
		// Box–Muller; 1-u keeps the logarithm finite.
		u1, u2 := 1-unit(key^saltLen1), unit(key^saltLen2)
		z := math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
		if d.kind == distNormal {
			v = math.Round(d.a + d.b*z)
		} else {
			v = math.Round(d.a * math.Exp(d.b*z))
		}
	}
	if v < 1 {
		return 1
	}
	if v > float64(max) {
		return max
	}
	return int(v)
}
