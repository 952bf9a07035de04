package jsonscan

import (
	"bytes"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

func TestMember(t *testing.T) {
	ids := strings.Repeat("128000,", 5000) + "1"
	for _, c := range []struct {
		in, want string
		err      bool
	}{
		{`{"count":15,"max_model_len":8192,"tokens":[1,2,3],"token_strs":null}`, `15`, false},
		{` { "tokens" : [` + ids + `] , "count" : 5001 } `, `5001`, false},
		{`{"a":{"count":1,"b":[{"count":2}]},"s":"\"count\":3","count":4}`, `4`, false},
		{`{"a":"}]\\","count":7}`, `7`, false},
		{`{"a":"\\\\","count":8}`, `8`, false},      // a string ending in an escaped backslash
		{`{"a":"\\\"}\\\\","count":9}`, `9`, false}, // escaped quote, then escaped backslash
		{`{"count":"12"}`, `"12"`, false},
		{`{"count":12`, `12`, false}, // found before the truncation: the caller reads no further
		{`{}`, ``, true},
		{`{"tokens":[1,2]}`, ``, true},
		{`[1,2]`, ``, true},
		{`{"tokens":[1,2`, ``, true},
		{`{"a":"x`, ``, true},
		{`{"a" 1}`, ``, true},
		{`{"a":1 "count":2}`, ``, true},
		{``, ``, true},
	} {
		got, err := Member([]byte(c.in), "count")
		if (err != nil) != c.err || string(got) != c.want {
			t.Errorf("Member(%.60q) = %q, %v; want %q (error %v)", c.in, got, err, c.want, c.err)
		}
	}
}

// On every JSON object fastjson accepts, jsonMember finds the same first
// member (keys without escapes).
func FuzzMember(f *testing.F) {
	for _, s := range []string{`{"count":15,"tokens":[1,2,3]}`, `{"a":{"count":1},"count":[2,{"x":"]"}]}`, `{"count":null}`, `{"x":"\\\"","count":-3e5}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Member(data, "count")
		v, perr := fastjson.ParseBytes(data)
		if perr != nil || v.Type() != fastjson.TypeObject || bytes.Contains(data, []byte(`\`)) {
			return
		}
		o, _ := v.Object()
		var want *fastjson.Value
		o.Visit(func(k []byte, v *fastjson.Value) {
			if want == nil && string(k) == "count" {
				want = v
			}
		})
		if want == nil {
			if err == nil {
				t.Fatalf("Member(%q) found %q where there is no count", data, got)
			}
			return
		}
		if err != nil {
			t.Fatalf("Member(%q): %v; want %s", data, err, want)
		}
		gv, gerr := fastjson.ParseBytes(got)
		if gerr != nil || gv.String() != want.String() {
			t.Fatalf("Member(%q) = %q; want %s", data, got, want)
		}
	})
}

func TestMembers(t *testing.T) {
	data := []byte(` { "a" : 1 ,"b\"c":{"x":[1,"}"]}, "d":"e" } `)
	type m struct{ name, member, value string }
	var got []m
	if err := Members(data, func(name []byte, start, value, end int) bool {
		got = append(got, m{string(name), string(data[start:end]), string(data[value:end])})
		return true
	}); err != nil {
		t.Fatal(err)
	}
	want := []m{{"a", `"a" : 1`, `1`}, {`b\"c`, `"b\"c":{"x":[1,"}"]}`, `{"x":[1,"}"]}`}, {"d", `"d":"e"`, `"e"`}}
	if len(got) != len(want) {
		t.Fatalf("Members visited %q; want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("member %d = %q; want %q", i, got[i], want[i])
		}
	}
	n := 0
	if err := Members(data, func([]byte, int, int, int) bool { n++; return false }); err != nil || n != 1 {
		t.Errorf("Members stopped by fn: %d calls, %v; want 1 call, no error", n, err)
	}
	for _, bad := range []string{`[]`, `{"a":1`, `{"a" 1}`, `{"a":1,}`} {
		if err := Members([]byte(bad), func([]byte, int, int, int) bool { return true }); err == nil {
			t.Errorf("Members(%q): no error", bad)
		}
	}
}
