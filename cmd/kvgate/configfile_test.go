package main

import (
	"strings"
	"testing"
)

func TestExpandEnv(t *testing.T) {
	env := map[string]string{"URL": "http://vllm:8000", "EMPTY": "", "NL": "a\nb: c"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, tc := range []struct{ name, in, want, err string }{
		{"plain", "url: ${URL}\n", "url: http://vllm:8000\n", ""},
		{"two on a line", "x: ${URL} ${URL}", "x: http://vllm:8000 http://vllm:8000", ""},
		{"default used when unset", "m: ${MODEL:-llama-3-8b}", "m: llama-3-8b", ""},
		{"default used when empty", "m: ${EMPTY:-x}", "m: x", ""},
		{"default not used when set", "u: ${URL:-x}", "u: http://vllm:8000", ""},
		{"empty default", "m: ${MODEL:-}", "m: ", ""},
		{"escaped", "k: $${URL}", "k: ${URL}", ""},
		{"lone dollar stays", "api_key: sk-$abc$", "api_key: sk-$abc$", ""},
		{"comment lines untouched", "  # url: ${UNSET}\nu: 1", "  # url: ${UNSET}\nu: 1", ""},
		{"unset", "a: 1\nurl: ${BACKEND_URL}", "", "line 2: environment variable BACKEND_URL is not set"},
		{"unclosed", "url: ${URL", "", "line 1: ${ without a closing }"},
		{"bad name", "url: ${1X}", "", "not a variable name"},
		{"line break refused", "x: ${NL}", "", "holds a line break"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := expandEnv([]byte(tc.in), lookup)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
