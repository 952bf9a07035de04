//go:build linux

package connwatch

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Watcher watches many connections with one epoll instance and one
// goroutine.
type Watcher struct {
	epfd int
	// wake is an eventfd that unblocks the loop on Close.
	wake int

	mu      sync.Mutex // guards entries, gen, closed
	entries map[int32]*entry
	gen     uint32
	closed  bool

	done chan struct{}
}

type entry struct {
	fd       int32
	gen      uint32
	onHangup func()
	// fired is closed once the callback has run (or will never run).
	once sync.Once
}

// New starts a Watcher.
func New() (*Watcher, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("connwatch: epoll_create1: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("connwatch: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(wake)
		return nil, fmt.Errorf("connwatch: epoll_ctl wake: %w", err)
	}
	w := &Watcher{epfd: epfd, wake: wake, entries: make(map[int32]*entry), done: make(chan struct{})}
	go w.loop()
	return w, nil
}

// Watch calls onHangup (in the Watcher's goroutine; keep it short, e.g.
// cancel a context) when the peer of c hangs up. The returned stop
// unregisters c; after stop returns, onHangup is not running and will not
// run. stop reports whether it stopped the watch before the callback ran.
func (w *Watcher) Watch(c net.Conn, onHangup func()) (stop func() bool, err error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, ErrUnsupported
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, errors.Join(ErrUnsupported, err)
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil, ErrClosed
	}
	w.gen++
	e := &entry{gen: w.gen, onHangup: onHangup}
	var ctlErr error
	cerr := rc.Control(func(fd uintptr) {
		e.fd = int32(fd)
		ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR | unix.EPOLLONESHOT, Fd: e.fd, Pad: int32(e.gen)}
		ctlErr = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev)
		if errors.Is(ctlErr, unix.EEXIST) {
			// A stale registration of a previous connection on this fd
			// number: the kernel drops registrations when the file closes,
			// so this only happens if a stop was missed. Replace it.
			ctlErr = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_MOD, int(fd), &ev)
		}
	})
	if cerr == nil && ctlErr == nil {
		w.entries[e.fd] = e
	}
	w.mu.Unlock()
	if cerr != nil {
		return nil, errors.Join(ErrUnsupported, cerr)
	}
	if ctlErr != nil {
		return nil, fmt.Errorf("connwatch: epoll_ctl: %w", ctlErr)
	}
	return func() bool { return w.stop(e) }, nil
}

func (w *Watcher) stop(e *entry) bool {
	w.mu.Lock()
	if cur, ok := w.entries[e.fd]; ok && cur == e {
		delete(w.entries, e.fd)
		// The fd is still open here (stop runs before the conn closes).
		_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, int(e.fd), nil)
	}
	w.mu.Unlock()
	stopped := false
	// Either we win and the callback never runs, or the loop won and we wait
	// for its callback to finish.
	e.once.Do(func() { stopped = true })
	return stopped
}

func (w *Watcher) loop() {
	defer close(w.done)
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(w.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		for i := range n {
			ev := events[i]
			if int(ev.Fd) == w.wake {
				return
			}
			w.mu.Lock()
			e, ok := w.entries[ev.Fd]
			if ok && e.gen == uint32(ev.Pad) {
				delete(w.entries, ev.Fd)
				_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, int(ev.Fd), nil)
			} else {
				e = nil
			}
			w.mu.Unlock()
			if e != nil {
				e.once.Do(e.onHangup)
			}
		}
	}
}

// Close stops the Watcher. Registered callbacks never run after Close
// returns; their stop functions remain safe to call.
func (w *Watcher) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	var one = [8]byte{1}
	if _, err := unix.Write(w.wake, one[:]); err != nil {
		return fmt.Errorf("connwatch: wake: %w", os.NewSyscallError("write", err))
	}
	<-w.done
	w.mu.Lock()
	for fd, e := range w.entries {
		delete(w.entries, fd)
		e.once.Do(func() {})
	}
	w.mu.Unlock()
	unix.Close(w.wake)
	return unix.Close(w.epfd)
}
