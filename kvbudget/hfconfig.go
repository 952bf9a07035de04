package kvbudget

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"strings"
)

// hfConfig is a decoded config.json. Values stay untyped because the same
// meaning hides under different keys (and sometimes types) in each family.
type hfConfig map[string]any

// keyError is a config that lacks, or mistypes, a key the geometry needs.
type keyError struct {
	keys   []string // the accepted spellings, preferred first
	reason string
}

func (e *keyError) Error() string {
	k := fmt.Sprintf("%q", e.keys[0])
	if len(e.keys) > 1 {
		alts := make([]string, len(e.keys)-1)
		for i, a := range e.keys[1:] {
			alts[i] = fmt.Sprintf("%q", a)
		}
		k += " (or " + strings.Join(alts, ", ") + ")"
	}
	return "config key " + k + ": " + e.reason
}

// ErrMissingKey is matched (errors.Is) by every error about an absent key.
var ErrMissingKey = errors.New("missing key")

func (e *keyError) Is(target error) bool { return target == ErrMissingKey && e.reason == "missing" }

func parseHFConfig(data []byte) (hfConfig, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var c hfConfig
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if c == nil {
		return nil, errors.New("invalid config: top level is not a JSON object")
	}
	return c, nil
}

// intKey returns the first of keys that is present and not null. A present key
// that is not a whole non-negative number is an error even if a later spelling
// would do, because it means the config is not what we think it is.
func (c hfConfig) intKey(keys ...string) (v int, found string, err error) {
	for _, k := range keys {
		raw, ok := c[k]
		if !ok || raw == nil {
			continue
		}
		n, ok := raw.(json.Number)
		if !ok {
			return 0, k, &keyError{keys: []string{k}, reason: fmt.Sprintf("want a number, got %v", raw)}
		}
		i, perr := n.Int64()
		if perr != nil || i < 0 || i > math.MaxInt32 {
			return 0, k, &keyError{keys: []string{k}, reason: fmt.Sprintf("want a whole number >= 0, got %s", n)}
		}
		return int(i), k, nil
	}
	return 0, "", nil
}

// requireInt is intKey for a key the geometry cannot do without.
func (c hfConfig) requireInt(keys ...string) (int, error) {
	v, found, err := c.intKey(keys...)
	if err != nil {
		return 0, err
	}
	if found == "" {
		return 0, &keyError{keys: keys, reason: "missing"}
	}
	if v == 0 {
		return 0, &keyError{keys: []string{found}, reason: "must be > 0"}
	}
	return v, nil
}

// optInt is intKey with a default for an absent key.
func (c hfConfig) optInt(def int, keys ...string) (int, error) {
	v, found, err := c.intKey(keys...)
	if err != nil {
		return 0, err
	}
	if found == "" {
		return def, nil
	}
	return v, nil
}

func (c hfConfig) floatKey(def float64, key string) (float64, error) {
	raw, ok := c[key]
	if !ok || raw == nil {
		return def, nil
	}
	n, ok := raw.(json.Number)
	if !ok {
		return 0, &keyError{keys: []string{key}, reason: fmt.Sprintf("want a number, got %v", raw)}
	}
	f, err := n.Float64()
	if err != nil {
		return 0, &keyError{keys: []string{key}, reason: err.Error()}
	}
	return f, nil
}

func (c hfConfig) boolKey(def bool, key string) bool {
	if b, ok := c[key].(bool); ok {
		return b
	}
	return def
}

func (c hfConfig) has(key string) bool {
	v, ok := c[key]
	return ok && v != nil
}

func (c hfConfig) str(key string) string {
	s, _ := c[key].(string)
	return s
}

func (c hfConfig) sub(key string) hfConfig {
	m, _ := c[key].(map[string]any)
	return hfConfig(m)
}

// ReadModelConfig reads a Hugging Face config.json from fsys. name may be the
// file itself or a directory holding config.json, as a downloaded model
// snapshot is.
func ReadModelConfig(fsys fs.FS, name string) (*Model, error) {
	if st, err := fs.Stat(fsys, name); err == nil && st.IsDir() {
		name = path.Join(name, "config.json")
	}
	data, err := fs.ReadFile(fsys, name)
	if err != nil {
		return nil, fmt.Errorf("read model config: %w", err)
	}
	m, err := ParseModelConfig(data)
	if err != nil {
		return nil, fmt.Errorf("model config %s: %w", name, err)
	}
	return m, nil
}
