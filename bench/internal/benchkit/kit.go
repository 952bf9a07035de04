package benchkit

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Main runs a benchmark's run until it returns or the process is
// interrupted, and exits non-zero, naming the benchmark, when it fails.
func Main(name string, run func(context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Kit is one benchmark run: the kvgate binary it starts and the directory
// its configs, logs and reports go to.
type Kit struct {
	Bin string // the kvgate binary
	Dir string // configs, logs and reports

	mu    sync.Mutex // guards procs
	procs []*Process // every process started, for StopAll
}

// New prepares a run: dir ("" makes a temporary one named after prefix)
// and the kvgate binary bin ("" builds ./cmd/kvgate into dir; run from the
// repository root).
func New(ctx context.Context, prefix, dir, bin string) (*Kit, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", prefix)
		if err != nil {
			return nil, err
		}
		dir = d
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if bin == "" {
		bin = filepath.Join(dir, "kvgate")
		fmt.Fprintf(os.Stderr, "building kvgate into %s\n", bin)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/kvgate")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		// go-nvml's C header warns about deprecated calls otherwise.
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go build ./cmd/kvgate (run from the repository root): %w", err)
		}
	}
	return &Kit{Bin: bin, Dir: dir}, nil
}

// Header prints a benchmark's first lines: its name, the machine, the
// time and what the run does (about), then where its files are (files
// says what they are).
func (k *Kit) Header(w io.Writer, name, about, files string) {
	fmt.Fprintf(w, "kvgate %s benchmark: %s, %d CPUs, %s; %s\n",
		name, runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02 15:04 MST"), about)
	fmt.Fprintf(w, "%s: %s\n\n", files, k.Dir)
}

// Path is name inside the run's directory.
func (k *Kit) Path(name string) string { return filepath.Join(k.Dir, name) }

// StopAll stops every process the run started that is still running, the
// last started first (gateways before the backends and the store they
// lean on).
func (k *Kit) StopAll() {
	k.mu.Lock()
	procs := k.procs
	k.procs = nil
	k.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop()
	}
}

// Slug turns a configuration's name into a file name.
func Slug(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '-'
	}, s)
}
