package gateway

import (
	"strings"
	"testing"
)

// One config with a dozen different problems — wrong types, an unknown key,
// values out of range, a missing file, a credential in a url — gets them
// all in one pass, each with its line, in the file's order.
func TestConfigErrorsInOnePass(t *testing.T) {
	const cfg = `listen: 127.0.0.1:0
admission:
  ceiling: 3
  queue_timeout: soon
  max_concurrency: many
models:
  - name: llama
    config: no-such-model-dir
    max_model_len: -5
    tokenizer: magic
    colour: blue
backends:
  - name: gpu0
    url: 'http://user:pw@127.0.0.1:1'
    models: [llama]
    gpu_memory: lots
    max_connections: -1
log: {level: loud}
routing: random
`
	_, err := Parse([]byte(cfg), t.TempDir())
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	want := []struct{ field, line string }{
		{"admission.ceiling:", "(line 3)"},
		{"admission.queue_timeout:", "(line 4)"},
		{"admission.max_concurrency: want a whole number", "(line 5)"},
		{"models[0].config: /", "(line 8)"},
		{"models[0].max_model_len:", "(line 9)"},
		{"models[0].tokenizer:", "(line 10)"},
		{"models[0].colour: unknown key", "(line 11)"},
		{"backends[0].url: holds credentials", "(line 14)"},
		{"backends[0].gpu_memory:", "(line 16)"},
		{"backends[0].max_connections:", "(line 17)"},
		{"log.level:", "(line 18)"},
		{"routing:", "(line 19)"},
	}
	lines := strings.Split(msg, "\n")
	at := 0
	for _, w := range want {
		found := false
		for ; at < len(lines); at++ {
			if strings.HasPrefix(lines[at], w.field) {
				found = true
				if !strings.Contains(lines[at], w.line) {
					t.Errorf("%q is not at %s", lines[at], w.line)
				}
				break
			}
		}
		if !found {
			t.Errorf("no %q (in the file's order) in:\n%s", w.field, msg)
			at = 0
		}
	}
	// The missing directory is shown in full, not by its base name.
	if !strings.Contains(msg, "/no-such-model-dir does not exist") {
		t.Errorf("the missing model directory:\n%s", msg)
	}
	if strings.Contains(msg, ":pw@") {
		t.Errorf("the url's password is shown:\n%s", msg)
	}
	// A field the shape refused is not complained of again as a value.
	if strings.Count(msg, "admission.max_concurrency") != 1 {
		t.Errorf("max_concurrency reported more than once:\n%s", msg)
	}
}

// A tab used for indentation is reported on its own line.
func TestYAMLTabNamesItsLine(t *testing.T) {
	const cfg = "listen: 127.0.0.1:0\nadmission:\n  ceiling: 0.8\n\tqueue_timeout: 5s\nmodels: []\n"
	_, err := Parse([]byte(cfg), ".")
	if err == nil || !strings.Contains(err.Error(), "line 4") || !strings.Contains(err.Error(), "tabs") {
		t.Fatalf("error %v, want line 4 and the tab hint", err)
	}
}
