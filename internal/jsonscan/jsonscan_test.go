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
