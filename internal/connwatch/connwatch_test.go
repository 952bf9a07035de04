package connwatch

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pair returns the server side and the client side of a loopback TCP
// connection.
func pair(t *testing.T, ln net.Listener) (server, client net.Conn) {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(ch)
			return
		}
		ch <- c
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, ok := <-ch
	if !ok {
		t.Fatal("accept failed")
	}
	return server, client
}

func listen(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func newWatcher(t *testing.T) *Watcher {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// The case the package exists for: the client closes while the server reads
// nothing, and the callback fires. The test fails by timing out if it never
// does.
func TestHangupFires(t *testing.T) {
	w, ln := newWatcher(t), listen(t)
	for _, how := range []string{"close", "reset"} {
		srv, cli := pair(t, ln)
		fired := make(chan struct{})
		stop, err := w.Watch(srv, func() { close(fired) })
		if err != nil {
			t.Fatal(err)
		}
		if how == "reset" {
			cli.(*net.TCPConn).SetLinger(0)
		}
		cli.Close()
		<-fired
		if stop() {
			t.Errorf("%s: stop after the callback ran reported it stopped the watch", how)
		}
		srv.Close()
	}
}

// Data the client sends (a pipelined request) is not a hang-up.
func TestDataIsNotHangup(t *testing.T) {
	w, ln := newWatcher(t), listen(t)
	srv, cli := pair(t, ln)
	defer srv.Close()
	defer cli.Close()
	var fired atomic.Bool
	stop, err := w.Watch(srv, func() { fired.Store(true) })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	// Give a wrong event every chance to arrive: read the bytes on the server,
	// which proves they were delivered, then check.
	buf := make([]byte, 64)
	srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := srv.Read(buf); err != nil {
		t.Fatal(err)
	}
	if fired.Load() {
		t.Fatal("callback fired for data, not a hang-up")
	}
	if !stop() {
		t.Error("stop before any hang-up should report it stopped the watch")
	}
}

func TestStopPreventsCallback(t *testing.T) {
	w, ln := newWatcher(t), listen(t)
	srv, cli := pair(t, ln)
	var fired atomic.Bool
	stop, err := w.Watch(srv, func() { fired.Store(true) })
	if err != nil {
		t.Fatal(err)
	}
	if !stop() {
		t.Fatal("stop reported the callback already ran")
	}
	cli.Close()
	// Register a fresh connection and wait for its hang-up: events are
	// delivered in order by the one loop, so the stopped one would have fired
	// first.
	srv2, cli2 := pair(t, ln)
	done := make(chan struct{})
	stop2, err := w.Watch(srv2, func() { close(done) })
	if err != nil {
		t.Fatal(err)
	}
	cli2.Close()
	<-done
	stop2()
	if fired.Load() {
		t.Fatal("callback ran after stop")
	}
	srv.Close()
	srv2.Close()
}

// A new connection that gets the fd number of an earlier one must not
// receive the earlier one's callback.
func TestFDReuseGetsOwnCallback(t *testing.T) {
	w, ln := newWatcher(t), listen(t)
	for range 20 {
		srv, cli := pair(t, ln)
		var mine atomic.Int32
		done := make(chan struct{})
		stop, err := w.Watch(srv, func() { mine.Add(1); close(done) })
		if err != nil {
			t.Fatal(err)
		}
		cli.Close()
		<-done
		stop()
		srv.Close() // frees the fd number for the next round
		if mine.Load() != 1 {
			t.Fatalf("callback ran %d times", mine.Load())
		}
	}
}

func TestUnsupported(t *testing.T) {
	w := newWatcher(t)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if _, err := w.Watch(a, func() {}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("net.Pipe: err = %v, want ErrUnsupported", err)
	}
}

func TestClose(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	srv, cli := pair(t, ln)
	defer srv.Close()
	defer cli.Close()
	stop, err := w.Watch(srv, func() { t.Error("callback after Close") })
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	cli.Close()
	stop() // still safe
	if _, err := w.Watch(srv, func() {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Watch after Close: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// Many connections hanging up and stopping concurrently, under -race: each
// callback runs at most once and only for its own connection.
func TestConcurrent(t *testing.T) {
	w, ln := newWatcher(t), listen(t)
	const n = 64
	var wg sync.WaitGroup
	var fired atomic.Int32
	for i := range n {
		srv, cli := pair(t, ln)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer srv.Close()
			done := make(chan struct{})
			stop, err := w.Watch(srv, func() { fired.Add(1); close(done) })
			if err != nil {
				t.Error(err)
				return
			}
			if i%2 == 0 {
				stop()
				cli.Close()
				return
			}
			cli.Close()
			<-done
			stop()
		}()
	}
	wg.Wait()
	if got := fired.Load(); got != n/2 {
		t.Fatalf("%d callbacks, want %d", got, n/2)
	}
}

// A fired registration stays in the epoll set, disabled, while its
// connection lives; watching the same connection again replaces it and
// reports the hang-up again.
func TestWatchAgainAfterFiring(t *testing.T) {
	w, ln := newWatcher(t), listen(t)
	srv, cli := pair(t, ln)
	defer srv.Close()
	defer cli.Close()
	for round := range 2 {
		fired := make(chan struct{})
		stop, err := w.Watch(srv, func() { close(fired) })
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if round == 0 {
			cli.(*net.TCPConn).CloseWrite() // the peer's side is shut from now on
		}
		<-fired
		if stop() {
			t.Errorf("round %d: stop after the callback reported it stopped the watch", round)
		}
	}
}
