package sse

import (
	"testing"
)

func TestData(t *testing.T) {
	tests := []struct{ ev, want string }{
		{"data: {\"a\":1}\n\n", `{"a":1}`},
		{"data:{\"a\":1}\r\n\r\n", `{"a":1}`},
		{": keep-alive\n\n", ""},
		{"event: x\ndata: one\ndata: two\n\n", "one\ntwo"},
	}
	for _, tt := range tests {
		if got := string(Data([]byte(tt.ev))); got != tt.want {
			t.Errorf("Data(%q) = %q, want %q", tt.ev, got, tt.want)
		}
	}
}
