package gateway

import (
	"testing"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/internal/chunkscan"
)

// Whatever chunkscan.Scan reads, the parse the relay would otherwise do reads
// the same: one choice of index 0, with a token or not, finished or not,
// and nothing more.
func FuzzScanChoice0(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"index":0,"delta":{"content":" one"},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"length"}]}`,
		`{"choices":[{"index":0,"finish_reason":"stop"}],"usage":{"prompt_tokens":3}}`,
		`{"error":{"message":"x"}}`, `{"choices":[{"text":"\"finish_reason\":null"}]}`,
		`{"choices":[{"index":0,"text":" one","finish_reason":null}],"usage":null}`,
		`{"choices":[{"index":0,"delta":{"reasoning":"x","content":null},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"reasoning_content":"","tool_calls":[]}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, ok := chunkscan.Scan(data)
		if !ok {
			return
		}
		v, err := fastjson.ParseBytes(data)
		if err != nil {
			return // a malformed event: the parse would act on nothing, the scan on what it read
		}
		if v.Get("error") != nil {
			t.Fatalf("read %s, which has an error", data)
		}
		if u := v.Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
			t.Fatalf("read %s, which has usage", data)
		}
		choices := v.GetArray("choices")
		if len(choices) != 1 || choices[0].GetInt("index") != 0 {
			t.Fatalf("read %s, which is not one choice of index 0", data)
		}
		ch := choices[0]
		n := generatedBytes(ch)
		if text := n > 0; text != c.Text {
			t.Fatalf("read %s as text %v; the parse says %v", data, c.Text, text)
		}
		// The bytes the relay counts of the scanned text are the text's
		// own (a delta may hold a reasoning beside its content: the scan
		// counts one of them).
		if c.Text {
			if b := textBytes(data[c.Start+1 : c.End-1]); b < 1 || b > n {
				t.Fatalf("read %s: %d bytes of text, the parse says %d", data, b, n)
			}
		}
		fr := ch.Get("finish_reason")
		if parsed := fr != nil && fr.Type() == fastjson.TypeString; parsed != (c.Finish != nil) ||
			parsed && string(fr.GetStringBytes()) != string(c.Finish) {
			t.Fatalf("read %s as finish %q; the parse says %s", data, c.Finish, fr)
		}
	})
}
