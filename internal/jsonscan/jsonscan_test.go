package jsonscan

import (
	"bytes"
	"errors"
	"slices"
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

func TestLookup(t *testing.T) {
	keys := []string{"messages", "tools"}
	for _, c := range []struct {
		in                string
		messages, tools   string
		err, escapedError bool
	}{
		{`{"model":"m","messages":[{"content":"a \"tools\": b"}],"tools":null}`, `[{"content":"a \"tools\": b"}]`, `null`, false, false},
		{` { "tools" : [ {"x":1} ] , "messages" : [] } `, `[]`, `[ {"x":1} ]`, false, false},
		{`{"messages":[1],"messages":[2]}`, `[1]`, ``, false, false}, // the first, as Member
		{`{"model":"m"}`, ``, ``, false, false},
		{`{}`, ``, ``, false, false},
		{`{"m\u0065ssages":[1],"messages":[2]}`, ``, ``, true, true},
		{`{"messages":[1],"tools":[2`, ``, ``, true, false},
		{`{"messages":[1] "tools":[2]}`, ``, ``, true, false},
		{`[{"messages":[1]}]`, ``, ``, true, false},
	} {
		out := make([][]byte, 2)
		err := Lookup([]byte(c.in), keys, out)
		if (err != nil) != c.err || errors.Is(err, ErrEscapedKey) != c.escapedError {
			t.Errorf("Lookup(%s): error %v, want error %v (escaped key %v)", c.in, err, c.err, c.escapedError)
			continue
		}
		if !c.err && (string(out[0]) != c.messages || string(out[1]) != c.tools) {
			t.Errorf("Lookup(%s) = %q %q; want %q %q", c.in, out[0], out[1], c.messages, c.tools)
		}
	}
}

func TestElements(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
		err  bool
	}{
		{`["one", "t,w]o" ,[1,[2]],{"a":"]"},null,-1.5e3]`, []string{`"one"`, `"t,w]o"`, `[1,[2]]`, `{"a":"]"}`, `null`, `-1.5e3`}, false},
		{` [ ] `, nil, false},
		{`["a" "b"]`, nil, true},
		{`["a",`, nil, true},
		{`{"a":1}`, nil, true},
	} {
		var got []string
		err := Elements([]byte(c.in), func(v []byte) { got = append(got, string(v)) })
		if (err != nil) != c.err || (!c.err && !slices.Equal(got, c.want)) {
			t.Errorf("Elements(%s) = %q, %v; want %q (error %v)", c.in, got, err, c.want, c.err)
		}
	}
}

// On every JSON object fastjson accepts whose keys have no escapes,
// Lookup finds each key's first value; on every array, Elements gives
// fastjson's elements.
func FuzzLookupElements(f *testing.F) {
	for _, s := range []string{`{"messages":[{"role":"user"}],"tools":[1],"x":"\""}`, `["a",1,{"b":[2]},null]`, `{"tools":null}`, `[]`} {
		f.Add([]byte(s))
	}
	keys := []string{"messages", "tools"}
	f.Fuzz(func(t *testing.T, data []byte) {
		out := make([][]byte, 2)
		merr := Lookup(data, keys, out)
		var got []string
		eerr := Elements(data, func(v []byte) { got = append(got, string(v)) })
		v, perr := fastjson.ParseBytes(data)
		if perr != nil {
			return
		}
		switch v.Type() {
		case fastjson.TypeObject:
			o, _ := v.Object()
			want := make([]*fastjson.Value, 2)
			o.Visit(func(k []byte, v *fastjson.Value) {
				for i, key := range keys {
					if want[i] == nil && string(k) == key {
						want[i] = v
					}
				}
			})
			// Visit gives keys unescaped, so whether one was written with
			// escapes shows only in the raw bytes; a key spelled with
			// escapes that Lookup missed shows as a wrong answer below.
			if errors.Is(merr, ErrEscapedKey) {
				if bytes.IndexByte(data, '\\') < 0 {
					t.Fatalf("Lookup(%q): ErrEscapedKey, but nothing is escaped", data)
				}
				return
			}
			if merr != nil {
				t.Fatalf("Lookup(%q): %v", data, merr)
			}
			for i := range keys {
				if (want[i] == nil) != (out[i] == nil) {
					t.Fatalf("Lookup(%q)[%s] = %q; want %v", data, keys[i], out[i], want[i])
				}
				if want[i] != nil {
					if gv, err := fastjson.ParseBytes(out[i]); err != nil || gv.String() != want[i].String() {
						t.Fatalf("Lookup(%q)[%s] = %q; want %s", data, keys[i], out[i], want[i])
					}
				}
			}
		case fastjson.TypeArray:
			items, _ := v.Array()
			if eerr != nil || len(got) != len(items) {
				t.Fatalf("Elements(%q) = %q, %v; want %d elements", data, got, eerr, len(items))
			}
			for i, it := range items {
				if gv, err := fastjson.ParseBytes([]byte(got[i])); err != nil || gv.String() != it.String() {
					t.Fatalf("Elements(%q)[%d] = %q; want %s", data, i, got[i], it)
				}
			}
		}
	})
}
