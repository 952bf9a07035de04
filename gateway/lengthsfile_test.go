package gateway

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/backends/sim"
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
// too old, or learned under another config of the model, which it says.
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

	cases := []struct {
		name    string
		maxLen  string
		age     time.Duration
		warm    bool
		warning string // in the log, when the file is ignored
	}{
		{"fresh", "8192", 20 * time.Minute, true, ""},
		{"stale", "8192", 2 * time.Hour, false, "older than max_age"},
		{"another config", "4096", time.Minute, false, "learned under another config of the model"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(path, b, 0o600); err != nil { // as the first gateway left it
				t.Fatal(err)
			}
			var logs syncBuffer
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
