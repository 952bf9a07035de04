package backends

import (
	"encoding/json"
	"slices"
	"strconv"
	"testing"
)

func TestParseCount(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{{"0", 0, true}, {"4096", 4096, true}, {"-1", 0, false}, {"1.5", 0, false}, {`"3"`, 0, false}, {"", 0, false}, {"1234567890123456789", 0, false}} {
		if n, ok := parseCount([]byte(c.in)); n != c.want || ok != c.ok {
			t.Errorf("parseCount(%q) = %d, %v; want %d, %v", c.in, n, ok, c.want, c.ok)
		}
	}
}

func TestParseIDs(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []uint32
		ok   bool
	}{
		{"[]", nil, true},
		{"[1,2,3]", []uint32{1, 2, 3}, true},
		{" [ 0 , 4294967295 ] ", []uint32{0, 4294967295}, true},
		{"[128000,\n9906]", []uint32{128000, 9906}, true},
		{"[4294967296]", nil, false},
		{"[12345678901]", nil, false},
		{"[-1]", nil, false},
		{"[1.5]", nil, false},
		{"[1,]", nil, false},
		{"[1 2]", nil, false},
		{`["1"]`, nil, false},
		{"[1]x", nil, false},
		{"[1", nil, false},
		{"null", nil, false},
		{"", nil, false},
	} {
		got, ok := parseIDs(nil, []byte(c.in))
		if ok != c.ok || ok && !slices.Equal(got, c.want) {
			t.Errorf("parseIDs(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// parseIDs reads a backend's answer: it must never panic, and what it
// accepts must be the list encoding/json reads.
func FuzzParseIDs(f *testing.F) {
	for _, s := range []string{"[]", "[1,2,3]", " [ 0 , 4294967295 ] ", "[1,]", "[-1]", "[1e3]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, ok := parseIDs(nil, []byte(in))
		if !ok {
			return
		}
		var want []uint32
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatalf("parseIDs(%q) accepted what encoding/json refuses: %v", in, err)
		}
		if !slices.Equal(got, want) && len(got)+len(want) > 0 {
			t.Fatalf("parseIDs(%q) = %v, encoding/json %v", in, got, want)
		}
	})
}

// BenchmarkParseIDs reads a 4096-token /tokenize answer's ids.
func BenchmarkParseIDs(b *testing.B) {
	var buf []byte
	buf = append(buf, '[')
	for i := range 4096 {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendInt(buf, int64(i*7919%128256), 10)
	}
	buf = append(buf, ']')
	ids := make([]uint32, 0, 4096)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		ids, _ = parseIDs(ids[:0], buf)
	}
}
