package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvgate/kvgate/gateway"
)

// loadConfig reads a gateway config file, expanding environment variables
// first (expandEnv), so that one file serves every container: its backend
// URL, say, comes from the pod's environment. Relative paths in the file
// resolve next to it.
func loadConfig(path string, lookup func(string) (string, bool)) (*gateway.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	data, err = expandEnv(data, lookup)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg, err := gateway.Parse(data, filepath.Dir(abs))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// expandEnv replaces ${NAME} with the variable's value and ${NAME:-default}
// with its value or, when it is unset or empty, the default; $${ is a
// literal ${. Nothing else is touched: a lone $ (in an API key, say) stays,
// and so do comment lines. An unset variable without a default is an error
// naming it and its line, never an empty string: a backend URL that is
// silently "" is worse than a refusal. A value holding a line break is
// refused too, since it could change the YAML's structure.
func expandEnv(data []byte, lookup func(string) (string, bool)) ([]byte, error) {
	if !bytes.Contains(data, []byte("${")) {
		return data, nil
	}
	var out bytes.Buffer
	for i, line := range strings.SplitAfter(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			out.WriteString(line)
			continue
		}
		for {
			j := strings.Index(line, "${")
			if j < 0 {
				out.WriteString(line)
				break
			}
			if j > 0 && line[j-1] == '$' { // $${ → ${
				out.WriteString(line[:j])
				out.WriteString("{")
				line = line[j+2:]
				continue
			}
			end := strings.IndexByte(line[j:], '}')
			if end < 0 {
				return nil, fmt.Errorf("line %d: ${ without a closing }", i+1)
			}
			expr := line[j+2 : j+end]
			name, def, hasDef := strings.Cut(expr, ":-")
			if !validEnvName(name) {
				return nil, fmt.Errorf("line %d: ${%s}: not a variable name (write $${ for a literal ${)", i+1, expr)
			}
			val, ok := lookup(name)
			switch {
			case hasDef && (!ok || val == ""):
				val = def
			case !ok:
				return nil, fmt.Errorf("line %d: environment variable %s is not set (set it, or give a default: ${%s:-value})", i+1, name, name)
			}
			if strings.ContainsAny(val, "\r\n") {
				return nil, fmt.Errorf("line %d: environment variable %s holds a line break", i+1, name)
			}
			out.WriteString(line[:j])
			out.WriteString(val)
			line = line[j+end+1:]
		}
	}
	return out.Bytes(), nil
}

func validEnvName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
