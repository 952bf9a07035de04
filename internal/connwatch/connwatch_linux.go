//go:build linux

package connwatch

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Watcher watches many connections with one epoll instance and one
// goroutine.
//
// Locking: no lock is held across a system call that others wait on.
// life is read-held by Watch and stop for their epoll_ctl calls (so any
// number run at once) and write-held by Close to mark the Watcher closed,
// so the epoll fd is never closed under them; mu guards only the entries map and is held for map
// operations alone. Lock order: life, then mu.
type Watcher struct {
	epfd int
	// wake is an eventfd that unblocks the loop on Close.
	wake int
	gen  atomic.Uint32

	life   sync.RWMutex // guards closed and the epoll fd's validity
	closed bool

	mu      sync.Mutex // guards entries
	entries map[int32]*entry

	done chan struct{}
}

type entry struct {
	fd       int32
	gen      uint32
	onHangup func()
	// once runs onHangup, or is spent by stop so that it never runs.
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
	w.life.RLock()
	defer w.life.RUnlock()
	if w.closed {
		return nil, ErrClosed
	}
	e := &entry{gen: w.gen.Add(1), onHangup: onHangup}
	var ctlErr error
	cerr := rc.Control(func(fd uintptr) {
		e.fd = int32(fd)
		// In the map before the kernel can report anything for it. An
		// entry left under this fd number by a missed stop is replaced.
		w.mu.Lock()
		w.entries[e.fd] = e
		w.mu.Unlock()
		ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR | unix.EPOLLONESHOT, Fd: e.fd, Pad: int32(e.gen)}
		ctlErr = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev)
		if errors.Is(ctlErr, unix.EEXIST) {
			// A registration of this file left behind: one whose callback
			// fired (a one-shot registration stays, disabled, until the
			// file closes) or a missed stop. Replace it.
			ctlErr = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_MOD, int(fd), &ev)
		}
	})
	if cerr != nil || ctlErr != nil {
		w.mu.Lock()
		if cur, ok := w.entries[e.fd]; ok && cur == e {
			delete(w.entries, e.fd)
		}
		w.mu.Unlock()
		if cerr != nil {
			return nil, errors.Join(ErrUnsupported, cerr)
		}
		return nil, fmt.Errorf("connwatch: epoll_ctl: %w", ctlErr)
	}
	return func() bool { return w.stop(e) }, nil
}

func (w *Watcher) stop(e *entry) bool {
	w.life.RLock()
	w.mu.Lock()
	mine := false
	if cur, ok := w.entries[e.fd]; ok && cur == e {
		delete(w.entries, e.fd)
		mine = true
	}
	w.mu.Unlock()
	if mine && !w.closed {
		// The fd is still this connection's: stop runs before the conn
		// closes, so its number cannot have been reused.
		_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, int(e.fd), nil)
	}
	w.life.RUnlock()
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
			// The one-shot registration is disabled now; it goes when the
			// connection closes (or a later Watch of it replaces it), so
			// the loop makes no system call for it. Deleting it here could
			// race with a close and delete another file's registration
			// under a reused fd number.
			w.mu.Lock()
			e, ok := w.entries[ev.Fd]
			if ok && e.gen == uint32(ev.Pad) {
				delete(w.entries, ev.Fd)
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
	// Once closed is set under the write lock, no Watch or stop touches
	// the epoll fd again; the lock is not held while the loop finishes, so
	// a callback may still call stop.
	w.life.Lock()
	if w.closed {
		w.life.Unlock()
		return nil
	}
	w.closed = true
	w.life.Unlock()
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
