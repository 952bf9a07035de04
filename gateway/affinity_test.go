package gateway

import (
	"testing"

	"github.com/valyala/fastjson"
)

// Requests that share a prompt's beginning share an affinity key, whatever
// follows; the user field keys a request too; other prompts key elsewhere.
func TestAffinityKeys(t *testing.T) {
	system := `{"role":"system","content":"You are a careful assistant. Answer in French."}`
	key := func(body string, kind endpoint) (uint64, string) {
		t.Helper()
		var p fastjson.Parser
		r, err := parseRequest(&p, []byte(body), kind)
		if err != nil {
			t.Fatal(err)
		}
		return r.prefix, r.user
	}
	a, _ := key(`{"model":"m","messages":[`+system+`,{"role":"user","content":"Bonjour"}]}`, chatCompletions)
	b, _ := key(`{"model":"m","messages":[`+system+`,{"role":"user","content":"Quelle heure est-il ?"}]}`, chatCompletions)
	c, _ := key(`{"model":"m","messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"Bonjour"}]}`, chatCompletions)
	if a == 0 || a != b || a == c {
		t.Fatalf("shared system prompt keys %x and %x; another %x", a, b, c)
	}
	long := make([]byte, 3*affinityPrefix)
	for i := range long {
		long[i] = 'x'
	}
	d, _ := key(`{"model":"m","prompt":"`+string(long)+`a"}`, completions)
	e, _ := key(`{"model":"m","prompt":"`+string(long)+`b"}`, completions)
	if d == 0 || d != e {
		t.Fatalf("prompts that differ only past the prefix keyed %x and %x", d, e)
	}
	if _, user := key(`{"model":"m","prompt":"hi","user":"alice"}`, completions); user != "alice" {
		t.Fatalf("user %q", user)
	}
	if k, _ := key(`{"model":"m","prompt":[1,2,3]}`, completions); k != 0 {
		t.Fatalf("token ids keyed %x", k)
	}
}
