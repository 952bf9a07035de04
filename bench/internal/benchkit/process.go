package benchkit

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Kit is one benchmark run: the kvgate binary it starts and the directory
// its configs, logs and reports go to.
type Kit struct {
	Bin string // the kvgate binary
	Dir string // configs, logs and reports
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

// Path is name inside the run's directory.
func (k *Kit) Path(name string) string { return filepath.Join(k.Dir, name) }

// Process is a kvgate process the run started.
type Process struct {
	URL  string
	Log  string // its stdout and stderr
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts kvgate with args, its output in logName.log, and waits until
// url answers /health (the simulator) or /readyz (the gateway, args[0] ==
// "serve") with 200.
func (k *Kit) Start(ctx context.Context, logName, url string, args ...string) (*Process, error) {
	logf, err := os.Create(k.Path(logName + ".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, k.Bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &Process{URL: url, Log: logf.Name(), cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	path := "/health"
	if args[0] == "serve" {
		path = "/readyz"
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(url + path)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p, nil
			}
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("kvgate %s exited at start; see %s", strings.Join(args, " "), logf.Name())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("kvgate %s: %s did not answer within a minute", args[0], url+path)
		}
	}
}

// StartSim starts kvgate sim with args on a free loopback port.
func (k *Kit) StartSim(ctx context.Context, logName string, args ...string) (*Process, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	args = append([]string{"sim", "--listen", "127.0.0.1:" + strconv.Itoa(port)}, args...)
	return k.Start(ctx, logName, fmt.Sprintf("http://127.0.0.1:%d", port), args...)
}

// Stop ends the process with SIGTERM, and SIGKILL if it has not exited 30 s
// later.
func (p *Process) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.Kill()
	}
}

// Kill ends the process at once with SIGKILL — a machine that dies, not
// one that shuts down — and waits for it.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Signal sends sig (SIGHUP: reload a gateway's config).
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// FreePort is a loopback TCP port nothing listened on a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
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
