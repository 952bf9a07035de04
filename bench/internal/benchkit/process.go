package benchkit

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Process is a process the run started.
type Process struct {
	Addr string // the loopback host:port it listens on
	URL  string // where it answers: http://Addr, or redis://Addr/0
	Log  string // its stdout and stderr
	cmd  *exec.Cmd
	done chan struct{}
}

// Exec starts bin with args, its output in logName.log, and keeps it for
// StopAll. It does not wait for the process to be ready.
func (k *Kit) Exec(ctx context.Context, logName, bin string, args ...string) (*Process, error) {
	logf, err := os.Create(k.Path(logName + ".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", logName, err)
	}
	p := &Process{Log: logf.Name(), cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	k.mu.Lock()
	k.procs = append(k.procs, p)
	k.mu.Unlock()
	return p, nil
}

// waitReady polls ready until it holds. A process that exits first, or
// is not ready within the limit, is an error naming what was started and
// its log: a benchmark never runs on a part that did not come up.
func (p *Process) waitReady(what string, within time.Duration, ready func() bool) error {
	deadline := time.Now().Add(within)
	for !ready() {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited at start; the end of %s:\n%s", what, p.Log, logTail(p.Log, 20))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return fmt.Errorf("%s: not ready within %s; see %s", what, within, p.Log)
		}
	}
	return nil
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

// Alive says whether the process is still running.
func (p *Process) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// logTail is the last n lines of the log at path: a run that fails at the
// start may remove its directory, so the error carries them.
func logTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
