package gateway

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 12, item 10: a mistake in the file is reported by its path in the
// file, in the operator's words — never as a Go type name.
func TestConfigShapeErrorsByPath(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"misspelt nested key", "admission: {queue: {max_request: 5}}\n" + minimal,
			[]string{"admission.queue.max_request: unknown key (line 1); the keys here are max_requests, max_bytes, timeout"}},
		{"unknown key in a list item", strings.Replace(minimal, "gpu_memory: 24GiB", "gpu_memory: 24GiB\n    gpu_memroy: 1", 1),
			[]string{"backends[0].gpu_memroy: unknown key"}},
		{"every problem at once", "admission: {ceilng: 1}\nlog: {lvl: x}\n" + minimal,
			[]string{"admission.ceilng: unknown key", "log.lvl: unknown key"}},
		{"a word for a number", "admission: {ceiling: high}\n" + minimal, []string{`admission.ceiling: want a number, got "high"`}},
		{"a word for a whole number", strings.Replace(minimal, "config: ../examples/llama-3-8b.json", "config: ../examples/llama-3-8b.json\n    tp: two", 1),
			[]string{`models[0].tp: want a whole number, got "two"`}},
		{"a mapping for a list", "tenants: {name: t}\n" + minimal, []string{"tenants: want a list, got a mapping"}},
		{"a list for a string", "listen: [a, b]\n" + minimal, []string{"listen: want a string, got a list"}},
		{"a word for a bool", "admission: {feedback: {enabled: maybe}}\n" + minimal, []string{`admission.feedback.enabled: want true or false, got "maybe"`}},
		{"a mapping for a duration", "server: {read_timeout: {s: 1}}\n" + minimal, []string{"server.read_timeout: want a single value, got a mapping"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), ".")
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v\nwant it to contain %q", err, w)
				}
			}
			for _, goName := range []string{"gateway.", "Config", "float64", "int", "!!str", "unmarshal"} {
				if strings.Contains(err.Error(), goName) {
					t.Errorf("the error speaks Go (%q): %v", goName, err)
				}
			}
		})
	}
}

// Issue 12, item 10: a model config that cannot be read is named by the
// path it resolved to, so a relative path's base is visible.
func TestMissingModelConfigNamesTheResolvedPath(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "kvgate.yaml")
	if err := os.WriteFile(cfg, []byte(strings.Replace(minimal, "../examples/llama-3-8b.json", "models/nope.json", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadFile(cfg)
	if err == nil {
		var s *Server
		s, err = New(c, Options{DisableProbes: true})
		if err == nil {
			s.watch.Close()
		}
	}
	if want := filepath.Join(dir, "models", "nope.json"); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v\nwant it to name %s", err, want)
	}
}

// Issue 12, item 10: every refused reload is counted and reported with the
// field path — a file that does not even load included — and the running
// configuration stays.
func TestFailedReloadsAreCountedAndNamed(t *testing.T) {
	_, url := startSim(t, nil)
	dir := t.TempDir()
	path := filepath.Join(dir, "kvgate.yaml")
	good := baseConfig(url, "")
	write := func(y string) {
		if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(good)
	c, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := New(c, Options{DisableProbes: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Shutdown(context.Background())
	load := func() (*Config, error) { return LoadFile(path) }
	for _, bad := range []struct{ yaml, field string }{
		{good + "admission: {queue: {max_request: 5}}\n", "admission.queue.max_request: unknown key"}, // does not load
		{good + "admission: {ceiling: 3}\n", "admission.ceiling"},                                     // loads, fails validation
		{strings.Replace(good, "24GiB", "16GiB", 1), "weights do not fit"},                            // validates, fails to build
	} {
		write(bad.yaml)
		if err := gw.ReloadFrom(load); err == nil || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("reload of a bad file: %v, want it to name %s", err, bad.field)
		}
	}
	write(good)
	if err := gw.ReloadFrom(load); err != nil {
		t.Fatal(err)
	}
	if e, ok := counter(gw.m.reloads, "error"), counter(gw.m.reloads, "ok"); e != 3 || ok != 1 {
		t.Errorf("kvgate_config_reloads_total: error %v, ok %v; want 3 and 1", e, ok)
	}
}

// Issue 12, item 11: a model config without what the weight estimate needs
// is usable once weights_bytes is given, and says which key it lacks
// otherwise.
func TestModelWithoutWeightKeys(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ds.json"), []byte(`{"model_type":"deepseek_v3","hidden_size":7168,"num_hidden_layers":61,"num_attention_heads":128,"kv_lora_rank":512,"qk_rope_head_dim":64,"vocab_size":129280,"torch_dtype":"bfloat16"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(minimal, "../examples/llama-3-8b.json", "ds.json", 1)
	y = strings.Replace(y, "gpu_memory: 24GiB", "gpu_memory: 80GiB", 1)
	build := func(y string) error {
		c, err := Parse([]byte(y), dir)
		if err == nil {
			var s *Server
			if s, err = New(c, Options{DisableProbes: true}); err == nil {
				s.watch.Close()
			}
		}
		return err
	}
	if err := build(y); err == nil || !strings.Contains(err.Error(), "weights_bytes: required: the model config lacks intermediate_size") {
		t.Errorf("without weights_bytes: %v", err)
	}
	if err := build(strings.Replace(y, "config: ds.json", "config: ds.json\n    weights_bytes: 40GiB", 1)); err != nil {
		t.Errorf("with weights_bytes: %v", err)
	}
}
