package gateway

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

// lengthsFileConfig is a config that keeps its learned lengths in path,
// with extra model settings (e.g. max_model_len) in place of the base's.
func lengthsFileConfig(url, path, maxLen string) string {
	cfg := baseConfig(url, "admission: {reservation: predicted, warmup_samples: 20, lengths_file: {path: "+path+", interval: 10s, max_age: 1h}}\n")
	return strings.Replace(cfg, "max_model_len: 8192", "max_model_len: "+maxLen, 1)
}

// A gateway alone keeps what it learned of a model's output lengths in
// its lengths file, written every interval on its clock (atomically), and a
// gateway that starts from that file predicts at once — unless the file is
// too old, learned under another config of the model, or of another model,
// which it says.
func TestLengthsFileRestart(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.OutputLen = "fixed:24" })
	path := filepath.Join(t.TempDir(), "lengths.json")
	start := time.Unix(1.8e9, 0)
	clock := admissiontest.NewClock(start)
	_, gwURL := startGateway(t, lengthsFileConfig(url, path, "8192"), Options{Clock: clock})
	for range 30 {
		if r := postJSON(gwURL, "/v1/chat/completions", chatBody("hi", 100, false)); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("written before its interval")
	}
	clock.Advance(10 * time.Second)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("not written after its interval: %v", err)
	}
	var data lengthsFileData
	if err := json.Unmarshal(b, &data); err != nil || data.Version != lengthsFileVersion || !data.Written.Equal(start.Add(10*time.Second)) {
		t.Fatalf("file %s: %v", b, err)
	}
	if e, ok := data.Models["llama-3-8b"]; !ok || sampleCount(e.Lengths) != 30 {
		t.Fatalf("file %s, want the model's 30 samples", b)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*tmp")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}

	// another model: the file's entry is of a model this config lacks.
	otherModel := bytes.Replace(b, []byte(`"llama-3-8b"`), []byte(`"mistral-7b"`), 1)
	if bytes.Equal(otherModel, b) {
		t.Fatalf("file %s: no entry of llama-3-8b to rename", b)
	}
	cases := []struct {
		name    string
		file    []byte
		maxLen  string
		age     time.Duration
		warm    bool
		warning string // in the log, when the file is ignored
	}{
		{"fresh", b, "8192", 20 * time.Minute, true, ""},
		{"stale", b, "8192", 2 * time.Hour, false, "older than max_age"},
		{"another config", b, "4096", time.Minute, false, "learned under another config of the model"},
		{"another model", otherModel, "8192", time.Minute, false, "no such model in the config"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(path, c.file, 0o600); err != nil { // as the first gateway left it
				t.Fatal(err)
			}
			var logs syncbuf.Buffer
			later := admissiontest.NewClock(start.Add(10*time.Second + c.age))
			_, url2 := startGateway(t, lengthsFileConfig(url, path, c.maxLen), Options{Clock: later, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			q := getStatus(t, url2).Models[0]
			if q.Predicting != c.warm || (c.warm && (q.Samples != 30 || q.MedianLength != 24)) {
				t.Fatalf("started with %+v; want predicting %v", q, c.warm)
			}
			if c.warning != "" && !strings.Contains(logs.String(), c.warning) {
				t.Fatalf("no warning %q in\n%s", c.warning, logs.String())
			}
		})
	}
}
