package backends

import "testing"

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
