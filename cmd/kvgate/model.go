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
		return nil, fmt.Errorf("--model-config %s: %w", path, err)
	}
	return m, nil
}

// sizeFlag is a memory size flag that remembers how its unit was read.
type sizeFlag struct {
	raw  string
	size kvbudget.Size
	set  bool
}

func (s *sizeFlag) String() string { return s.raw }

func (s *sizeFlag) Set(v string) error {
	sz, err := kvbudget.ParseSize(v)
	if err != nil {
		return err
	}
	s.raw, s.size, s.set = v, sz, true
	return nil
}
