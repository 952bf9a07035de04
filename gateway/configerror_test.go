package gateway

import (
	"strings"
	"testing"
)

// A YAML syntax error names the line, shows it, and says what usually
// causes it, instead of the parser's bare "yaml: yaml: line 1: ...".
func TestYAMLSyntaxErrorsShowTheLineAndAHint(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string // in the message, in this order
		not        []string
	}{
		{"unclosed list", "listen: 127.0.0.1:8080\nmodels: [a\n",
			[]string{"line 2: did not find expected ',' or ']'", "2 | models: [a", "hint: a [list] is not closed"}, nil},
		{"unquoted colon", "listen: 127.0.0.1:8080\nrouting: a: b\n",
			[]string{"line 2: mapping values are not allowed", "2 | routing: a: b", `hint: a value that holds ": " must be quoted`}, nil},
		{"tab indentation", "models:\n\t- name: x\n",
			[]string{"line 2: found character that cannot start any token", "2 | →- name: x", "hint: YAML does not allow tabs"}, nil},
		{"bad indentation", "admission:\n  ceiling: 0.5\n queue: {}\n",
			[]string{"did not find expected key", "hint: check this line's indentation"}, nil},
		{"unclosed quote", "listen: \"127.0.0.1:8080\n",
			[]string{"found unexpected end of stream", "hint: a quoted string, [list] or {mapping} is not closed"}, nil},
		{"duplicate key", "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n",
			[]string{`line 2: mapping key "listen" already defined at line 1`, "2 | listen: 127.0.0.1:2", "hint: a key appears twice"}, nil},
		{"a key's line is not shown", "tenants:\n  - name: t\n    api_keys: [sk-live-123\n",
			[]string{"line 3", "[not shown: the line may hold a secret]"}, []string{"sk-live-123"}},
		{"credentials in a URL are not shown", "shared_budget: {redis: redis://u:hunter2@h:6379, replica: a: b}\n",
			[]string{"[not shown"}, []string{"hunter2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml), ".")
			if err == nil {
				t.Fatal("parsed")
			}
			msg := err.Error()
			if strings.Contains(msg, "yaml: yaml:") {
				t.Errorf("the prefix is doubled: %s", msg)
			}
			rest := msg
			for _, w := range c.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("%q is not in (or out of order in):\n%s", w, msg)
				}
				rest = rest[i+len(w):]
			}
			for _, n := range c.not {
				if strings.Contains(msg, n) {
					t.Errorf("%q is shown:\n%s", n, msg)
				}
			}
		})
	}
}
