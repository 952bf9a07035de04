package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// The lengths file: what a gateway alone learned of each model's output
// lengths, kept across restarts (admission.lengths_file). Without it a
// model's requests are held at their worst case after every restart until
// warmup_samples of them have finished; with it the gateway starts from
// what it knew when it stopped.
//
// It is trusted only as far as it can be:
//   - a file older than max_age is ignored (the traffic may have moved on);
//   - a model's lengths are merged only into the same model: its name and
//     a fingerprint of what sizes its requests (the KV layout, max_model_len,
//     the default output); a model whose config changed starts afresh, and
//     the gateway says why;
//   - what it merges is a forecast like any other: a model whose traffic
//     changed while the gateway was down is caught by the change detector,
//     which puts it back on its worst case, as it would a drift in service.
//
// It is written atomically (a temporary file in the same directory, then
// renamed over the old one), every interval and at shutdown.

// lengthsFileVersion is the format's version; another is ignored.
const lengthsFileVersion = 1

// lengthsFileData is the file's content.
type lengthsFileData struct {
	Version int       `json:"version"`
	Written time.Time `json:"written"`
	// Models holds each model's learned lengths, by its name.
	Models map[string]lengthsFileModel `json:"models"`
}

// lengthsFileModel is one model's entry.
type lengthsFileModel struct {
	// Fingerprint names what sizes the model's requests (modelFingerprint).
	Fingerprint string                 `json:"fingerprint"`
	Lengths     admission.LengthsDelta `json:"lengths"`
}

// modelFingerprint names what sizes m's requests: its KV layout, its
// max_model_len and the output reserved without max_tokens. Lengths
// learned under another are not this model's.
func modelFingerprint(m *model) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s|%+v|%d|%d", m.name, m.layout, m.maxLen, m.defaultMax))
	return hex.EncodeToString(h[:8])
}

// lengthsFile writes and reads the file for a Server.
type lengthsFile struct {
	s    *Server
	path string

	mu      sync.Mutex // guards timer and stopped; serialises writes
	timer   admission.Timer
	stopped bool
}

// startLengthsFile reads the file, if any, into the scheduler and starts
// writing it every interval; nil when lengths_file is off.
func (s *Server) startLengthsFile(cfg *Config, rt *runtime) *lengthsFile {
	c := cfg.Admission.LengthsFile
	if c.Path == "" {
		return nil
	}
	f := &lengthsFile{s: s, path: cfg.Path(c.Path)}
	f.restore(rt, c.MaxAge.D)
	f.mu.Lock()
	f.timer = s.opt.Clock.AfterFunc(c.Interval.D, f.tick)
	f.mu.Unlock()
	return f
}

// tick writes the file and schedules the next write.
func (f *lengthsFile) tick() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.saveLocked()
	f.timer = f.s.opt.Clock.AfterFunc(f.s.rt.Load().cfg.Admission.LengthsFile.Interval.D, f.tick)
}

// stop writes the file a last time and ends the writes.
func (f *lengthsFile) stop() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	f.timer.Stop()
	f.saveLocked()
}

// saveLocked writes what every model has learned (what it started from
// included: a restart before its first request forgets nothing). A file
// that was ignored at start is written over.
func (f *lengthsFile) saveLocked() {
	rt := f.s.rt.Load()
	data := lengthsFileData{Version: lengthsFileVersion, Written: f.s.now(), Models: map[string]lengthsFileModel{}}
	for _, name := range rt.modelOrder {
		m := rt.models[name]
		if m == nil {
			continue
		}
		d, ok, err := f.s.sched.LengthsState(name)
		if err != nil || !ok {
			continue
		}
		data.Models[name] = lengthsFileModel{Fingerprint: modelFingerprint(m), Lengths: d}
	}
	if err := writeFileAtomic(f.path, data); err != nil {
		f.s.log.Warn("admission.lengths_file: not written; the next write tries again", "path", f.path, "err", err)
	}
}

// writeFileAtomic writes v as JSON to path through a temporary file in the
// same directory, renamed over path: a reader sees the old file or the new
// one, never a part.
func writeFileAtomic(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing left to remove
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// restore merges the file's lengths into the scheduler's, model by model,
// where they are still this gateway's: a file too old, of another version,
// or a model's entry from another config is ignored with a warning that
// says why. No file is a first start.
func (f *lengthsFile) restore(rt *runtime, maxAge time.Duration) {
	log := f.s.log.With("path", f.path)
	b, err := os.ReadFile(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		log.Info("admission.lengths_file: none yet; models warm up from their own requests")
		return
	}
	var data lengthsFileData
	if err == nil {
		err = json.Unmarshal(b, &data)
	}
	if err != nil {
		log.Warn("admission.lengths_file: unreadable, ignored; models warm up from their own requests", "err", err)
		return
	}
	if data.Version != lengthsFileVersion {
		log.Warn("admission.lengths_file: ignored: written in another format", "version", data.Version, "want", lengthsFileVersion)
		return
	}
	if age := f.s.now().Sub(data.Written); age > maxAge {
		log.Warn("admission.lengths_file: ignored: older than max_age; models warm up from their own requests",
			"written", data.Written, "age", age.Round(time.Second).String(), "max_age", maxAge.String())
		return
	}
	for name, e := range data.Models {
		m := rt.models[name]
		switch {
		case m == nil:
			log.Warn("admission.lengths_file: a model's lengths ignored: no such model in the config", "model", name)
		case e.Fingerprint != modelFingerprint(m):
			log.Warn("admission.lengths_file: a model's lengths ignored: learned under another config of the model (its KV layout, max_model_len or default output changed)",
				"model", name, "file_fingerprint", e.Fingerprint, "fingerprint", modelFingerprint(m))
		default:
			if err := f.s.sched.MergeLengths(name, e.Lengths); err != nil {
				log.Warn("admission.lengths_file: a model's lengths ignored", "model", name, "err", err)
				continue
			}
			log.Info("admission.lengths_file: a model starts from its learned lengths", "model", name,
				"samples", sampleCount(e.Lengths), "written", data.Written)
		}
	}
}

// sampleCount is the (decayed) number of sequences a delta counts.
func sampleCount(d admission.LengthsDelta) float64 {
	var n float64
	for i := range d.All.Ended {
		n += d.All.Ended[i]
	}
	for i := range d.All.Capped {
		n += d.All.Capped[i]
	}
	return n
}
