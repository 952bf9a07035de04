// Package sharedbudgettest starts a real redis-server for tests of package sharedbudget
// and of its callers: on a free loopback port, persistence off, stopped
// when the test ends, and able to stop and come back on the same port. A
// HoleProxy stands between a client and the server to cut the link without
// closing it.
//
// Its waits are on wall time, not an injected clock: they bound how long a
// real process (redis-server) takes to start and stop.
package sharedbudgettest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long redis-server may take to say it is ready; on
// two busy cores it takes milliseconds, so reaching it means it is broken.
const startTimeout = 30 * time.Second

// Redis is a redis-server run by a test.
type Redis struct {
	t    testing.TB
	bin  string
	dir  string
	port int

	mu   sync.Mutex // guards proc
	proc *process
}

type process struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once Wait returned
	out    *lockedBuffer // its log, for failure messages
}

// StartRedis starts redis-server, or fails the test loudly: these tests
// never skip. Install it with apt-get install redis-server.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is required by these tests and was not found (apt-get install redis-server): %v", err)
	}
	r := &Redis{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(r.Stop)
	// A free port can be taken by someone else before redis-server binds
	// it; then it exits at once and another port is tried.
	var last error
	for range 5 {
		if r.port, err = freePort(); err != nil {
			t.Fatalf("sharedbudgettest: finding a free port: %v", err)
		}
		if last = r.start(); last == nil {
			return r
		}
	}
	t.Fatalf("sharedbudgettest: redis-server did not start: %v", last)
	return nil
}

// Addr is the server's host:port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// URL is the server's redis:// URL, as gateway configuration takes it.
func (r *Redis) URL() string { return "redis://" + r.Addr() + "/0" }

// Client returns a client of the server with go-redis's defaults, closed
// when the test ends. Each option function may change its options first
// (e.g. MaxRetries -1: go-redis retries a refused connection with backoff
// for about two seconds by default).
func (r *Redis) Client(opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: r.Addr()}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	r.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop stops the server (SIGTERM) and waits for it to exit; all its data is
// gone, as with a crash of a server without persistence. Stopping a stopped
// server does nothing.
func (r *Redis) Stop() {
	r.mu.Lock()
	p := r.proc
	r.proc = nil
	r.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(startTimeout): // wall time: a real process (see the package doc)
		_ = p.cmd.Process.Kill()
		<-p.exited
		r.t.Errorf("sharedbudgettest: redis-server ignored SIGTERM for %v; killed", startTimeout)
	}
}

// Restart starts the server again on the same port, empty.
func (r *Redis) Restart() {
	r.t.Helper()
	r.Stop()
	if err := r.start(); err != nil {
		r.t.Fatalf("sharedbudgettest: restarting redis-server on port %d: %v", r.port, err)
	}
}

// start runs redis-server and waits until it logs that it accepts
// connections, or exits.
func (r *Redis) start() error {
	cmd := exec.Command(r.bin,
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir,
		"--daemonize", "no", "--logfile", "", "--loglevel", "notice",
		// DEBUG SLEEP stands for a Redis that stops answering.
		"--enable-debug-command", "local")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("running %s: %w", r.bin, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{}), out: &lockedBuffer{}}
	ready := make(chan struct{})
	isReady := ready
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			p.out.writeLine(line)
			if ready != nil && strings.Contains(line, "Ready to accept connections") {
				close(ready)
				ready = nil
			}
		}
		_, _ = io.Copy(io.Discard, stdout) // a line past the scanner's limit
	}()
	go func() {
		<-scanned
		_ = cmd.Wait()
		close(p.exited)
	}()
	select {
	case <-isReady:
		r.mu.Lock()
		r.proc = p
		r.mu.Unlock()
		return nil
	case <-p.exited:
		return fmt.Errorf("redis-server exited before it was ready: %v; its log:\n%s", cmd.ProcessState, p.out.String())
	case <-time.After(startTimeout): // wall time: a real process (see the package doc)
		_ = cmd.Process.Kill()
		<-p.exited
		return errors.New("redis-server was not ready after " + startTimeout.String() + "; its log:\n" + p.out.String())
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) writeLine(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.WriteString(s)
	b.b.WriteByte('\n')
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
