package confval_test

import (
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/internal/confval"
)

func TestDuration(t *testing.T) {
	tests := []struct {
		text    string
		want    time.Duration
		wantErr string
	}{
		{"30s", 30 * time.Second, ""},
		{" 500ms ", 500 * time.Millisecond, ""},
		{"0s", 0, ""},
		{"soon", 0, `invalid duration "soon" (want e.g. 30s, 500ms, 2m): time: invalid duration "soon"`},
		{"30", 0, `invalid duration "30"`},
		{"-1s", -time.Second, `invalid duration "-1s" (want e.g. 30s, 500ms, 2m): must not be negative`},
	}
	for _, tt := range tests {
		var d confval.Duration
		if err := d.UnmarshalText([]byte(tt.text)); err != nil {
			t.Fatalf("%q: UnmarshalText returned %v; it keeps errors for validation", tt.text, err)
		}
		if d.D != tt.want || !d.Written() || !matches(d.Err(), tt.wantErr) {
			t.Errorf("%q: %v, written %v, err %v; want %v, err %q", tt.text, d.D, d.Written(), d.Err(), tt.want, tt.wantErr)
		}
	}
}

func TestSize(t *testing.T) {
	tests := []struct {
		text    string
		want    int64
		wantErr string
	}{
		{"16GiB", 16 << 30, ""},
		{"1024", 1024, ""},
		{"lots", 0, `invalid memory size "lots"`},
		{"-1GiB", 0, `memory size "-1GiB" is negative`},
	}
	for _, tt := range tests {
		var s confval.Size
		if err := s.UnmarshalText([]byte(tt.text)); err != nil {
			t.Fatalf("%q: UnmarshalText returned %v; it keeps errors for validation", tt.text, err)
		}
		if s.Bytes != tt.want || !matches(s.Err(), tt.wantErr) {
			t.Errorf("%q: %d, err %v; want %d, err %q", tt.text, s.Bytes, s.Err(), tt.want, tt.wantErr)
		}
	}
}

// YAML reads them through encoding.TextUnmarshaler; an absent or empty
// value is not written.
func TestFromYAML(t *testing.T) {
	var v struct {
		A, B, C confval.Duration
		S       confval.Size
	}
	if err := yaml.Unmarshal([]byte("a: 2m\nb:\ns: 1KiB\n"), &v); err != nil {
		t.Fatal(err)
	}
	if v.A.D != 2*time.Minute || v.B.Written() || v.C.Written() || v.S.Bytes != 1024 {
		t.Fatalf("%+v", v)
	}
}

func matches(err error, want string) bool {
	if want == "" {
		return err == nil
	}
	return err != nil && strings.Contains(err.Error(), want)
}

func TestOr(t *testing.T) {
	for _, tc := range []struct{ d, def, want time.Duration }{
		{0, time.Second, time.Second},
		{-1, time.Second, 0},
		{time.Millisecond, time.Second, time.Millisecond},
	} {
		if got := confval.Or(tc.d, tc.def); got != tc.want {
			t.Errorf("Or(%v, %v) = %v, want %v", tc.d, tc.def, got, tc.want)
		}
	}
}
