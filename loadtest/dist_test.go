package loadtest

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func fakeFiles(files map[string]string) func(string) ([]byte, error) {
	return func(p string) ([]byte, error) {
		if s, ok := files[p]; ok {
			return []byte(s), nil
		}
		return nil, errors.New("open " + p + ": no such file or directory")
	}
}

func TestParseDist(t *testing.T) {
	files := fakeFiles(map[string]string{
		"lens.txt":  "# prompt lengths\n128\n\n256\n  512  \n",
		"bad.txt":   "128\nabc\n",
		"zero.txt":  "128\n0\n",
		"empty.txt": "# nothing\n\n",
	})
	for _, tc := range []struct {
		spec    string
		want    string // String() of the result
		wantErr string // substring of the error
	}{
		{spec: "fixed:512", want: "fixed:512"},
		{spec: "512", want: "fixed:512"},
		{spec: " FIXED:7 ", want: "fixed:7"},
		{spec: "uniform:128-1024", want: "uniform:128-1024"},
		{spec: "uniform:5-5", want: "uniform:5-5"},
		{spec: "normal:512,64", want: "normal:512,64"},
		{spec: "normal:512,0", want: "normal:512,0"},
		{spec: "lognormal:400,0.8", want: "lognormal:400,0.8"},
		{spec: "file:lens.txt", want: "file:lens.txt"},

		{spec: "", wantErr: "empty distribution"},
		{spec: "fixed:0", wantErr: "length must be in [1,"},
		{spec: "fixed:-3", wantErr: "length must be in [1,"},
		{spec: "fixed:1.5", wantErr: "not a whole number"},
		{spec: "fixed:99999999", wantErr: "length must be in [1,"},
		{spec: "uniform:10", wantErr: "joined by '-'"},
		{spec: "uniform:20-10", wantErr: "A (20) is greater than B (10)"},
		{spec: "uniform:x-10", wantErr: "A: \"x\" is not a whole number"},
		{spec: "normal:512", wantErr: "two numbers joined by ','"},
		{spec: "normal:512,-1", wantErr: "SD must be in [0,"},
		{spec: "normal:0,5", wantErr: "MEAN must be in [1,"},
		{spec: "normal:NaN,5", wantErr: "is not a number"},
		{spec: "lognormal:400,11", wantErr: "SIGMA must be in [0, 10]"},
		{spec: "lognormal:0,1", wantErr: "MEDIAN must be in [1,"},
		{spec: "file:", wantErr: "empty path"},
		{spec: "file:missing.txt", wantErr: "no such file"},
		{spec: "file:bad.txt", wantErr: "line 2"},
		{spec: "file:zero.txt", wantErr: "line 2: length must be in [1,"},
		{spec: "file:empty.txt", wantErr: "no lengths in the file"},
		{spec: "gamma:2,3", wantErr: "unknown distribution \"gamma\""},
		{spec: "abc", wantErr: "want fixed:N"},
	} {
		d, err := ParseDist(tc.spec, files)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseDist(%q) error = %v, want it to contain %q", tc.spec, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("ParseDist(%q): %v", tc.spec, err)
		case d.String() != tc.want:
			t.Errorf("ParseDist(%q).String() = %q, want %q", tc.spec, d.String(), tc.want)
		}
	}
}

func samples(t *testing.T, spec string, n int, files func(string) ([]byte, error)) []int {
	t.Helper()
	d, err := ParseDist(spec, files)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 7))
	out := make([]int, n)
	for i := range out {
		out[i] = d.Sample(r)
	}
	return out
}

func meanOf(xs []int) float64 {
	s := 0.0
	for _, x := range xs {
		s += float64(x)
	}
	return s / float64(len(xs))
}

func TestDistSamples(t *testing.T) {
	const n = 20000
	if xs := samples(t, "fixed:300", 100, nil); slices.Min(xs) != 300 || slices.Max(xs) != 300 {
		t.Errorf("fixed varies: %v..%v", slices.Min(xs), slices.Max(xs))
	}
	u := samples(t, "uniform:10-20", n, nil)
	if slices.Min(u) != 10 || slices.Max(u) != 20 || !near(meanOf(u), 15, 0.1) {
		t.Errorf("uniform:10-20 range %d..%d mean %g", slices.Min(u), slices.Max(u), meanOf(u))
	}
	nm := samples(t, "normal:500,50", n, nil)
	if !near(meanOf(nm), 500, 2) {
		t.Errorf("normal mean %g", meanOf(nm))
	}
	// A normal mostly below 1 is truncated, never below 1.
	if lo := slices.Min(samples(t, "normal:2,20", n, nil)); lo < 1 {
		t.Errorf("normal sample below 1: %d", lo)
	}
	ln := samples(t, "lognormal:400,0.5", n, nil)
	slices.Sort(ln)
	if med := ln[n/2]; med < 390 || med > 410 {
		t.Errorf("lognormal median %d, want about 400", med)
	}
	f := samples(t, "file:l", n, fakeFiles(map[string]string{"l": "1\n2\n3\n"}))
	counts := map[int]int{}
	for _, x := range f {
		counts[x]++
	}
	for _, v := range []int{1, 2, 3} {
		if c := counts[v]; math.Abs(float64(c)-n/3.0) > n/30.0 {
			t.Errorf("file value %d drawn %d times of %d", v, c, n)
		}
	}
	// Same seed, same sequence: runs repeat.
	if a, b := samples(t, "lognormal:400,1", 50, nil), samples(t, "lognormal:400,1", 50, nil); !slices.Equal(a, b) {
		t.Error("same seed gave different lengths")
	}
}

// FuzzParseDist: any spec either parses to a distribution whose samples are
// in [1, MaxLength] and whose String parses again to the same thing, or is
// an error; never a panic.
func FuzzParseDist(f *testing.F) {
	for _, s := range []string{"fixed:512", "512", "uniform:1-9", "normal:100,10", "lognormal:300,2", "file:a", "uniform:-", "normal:,", ":", "fixed:"} {
		f.Add(s)
	}
	files := fakeFiles(map[string]string{"a": "5\n7\n"})
	f.Fuzz(func(t *testing.T, spec string) {
		d, err := ParseDist(spec, files)
		if err != nil {
			if d != nil {
				t.Fatalf("error with a distribution: %v", err)
			}
			return
		}
		r := rand.New(rand.NewPCG(1, 2))
		for range 20 {
			if v := d.Sample(r); v < 1 || v > MaxLength {
				t.Fatalf("%q sampled %d", spec, v)
			}
		}
		d2, err := ParseDist(d.String(), files)
		if err != nil || d2.String() != d.String() {
			t.Fatalf("%q → %q does not parse back: %v", spec, d.String(), err)
		}
	})
}
