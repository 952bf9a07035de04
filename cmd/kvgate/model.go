package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvgate/kvgate/kvbudget"
)

// loadModel reads a Hugging Face config.json, or a directory holding one.
func loadModel(path string) (*kvbudget.Model, error) {
	if path == "" {
		return nil, fmt.Errorf("--model-config is required (a Hugging Face config.json or a directory holding one)")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("--model-config %s: %w", path, err)
	}
	m, err := kvbudget.ReadModelConfig(os.DirFS(filepath.Dir(abs)), filepath.Base(abs))
	if err != nil {
		if abs != path {
			return nil, fmt.Errorf("--model-config %s (%s): %w", path, abs, err)
		}
		return nil, fmt.Errorf("--model-config %s: %w", path, err)
	}
	return m, nil
}

// sizeFlag is a memory size flag that remembers how its unit was read.
// A GPU's memory (gpu) must carry a unit: "24" is not 24 bytes.
type sizeFlag struct {
	raw  string
	size kvbudget.Size
	set  bool
	gpu  bool
}

func (s *sizeFlag) String() string { return s.raw }

func (s *sizeFlag) Set(v string) error {
	parse := kvbudget.ParseSize
	if s.gpu {
		parse = kvbudget.ParseMemory
	}
	sz, err := parse(v)
	if err != nil {
		return err
	}
	s.raw, s.size, s.set = v, sz, true
	return nil
}
