package confval

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvgate/kvgate/kvbudget"
)

// Duration is a duration as a file writes it ("30s", "500ms", "2m"). From a
// file it is never negative; code may set D to a negative value where the
// field documents what that means.
type Duration struct {
	D   time.Duration
	raw string
	err error
}

// UnmarshalText keeps the text and any parse error for validation.
func (d *Duration) UnmarshalText(text []byte) error {
	d.raw = string(text)
	d.D, d.err = time.ParseDuration(strings.TrimSpace(d.raw))
	if d.err == nil && d.D < 0 {
		d.err = errors.New("must not be negative")
	}
	if d.err != nil {
		d.err = fmt.Errorf("invalid duration %q (want e.g. 30s, 500ms, 2m): %w", d.raw, d.err)
	}
	return nil
}

// Err is the reason the text was not a duration, or nil.
func (d Duration) Err() error { return d.err }

// Written says whether the file gave a value at all: an explicit "0s" is
// written, an absent key is not. Fields whose zero is meaningful ("0s: at
// once") fill their default only when nothing was written.
func (d Duration) Written() bool { return d.raw != "" }

// Or resolves a configured duration by the usual convention of kvgate's
// configs: 0 is def, a negative one is none (0).
func Or(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// Size is a memory size as a file writes it ("24GiB", "80GB", or bytes).
// From a file it is never negative; code may set Bytes to a negative value
// where the field documents what that means.
type Size struct {
	Bytes int64
	err   error
}

// UnmarshalText keeps any parse error for validation.
func (s *Size) UnmarshalText(text []byte) error {
	sz, err := kvbudget.ParseSize(string(text))
	s.Bytes, s.err = sz.Bytes, err
	return nil
}

// Err is the reason the text was not a size, or nil.
func (s Size) Err() error { return s.err }
