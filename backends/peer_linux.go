//go:build linux

package backends

import (
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fdConn is an upstream connection with its descriptor, kept from the
// dial: checking it before each reuse then costs one system call, where
// asking the connection for its descriptor allocated a raw-connection
// handle and a callback every time. The descriptor stays valid until the
// connection is closed, and a pooled connection is checked only while the
// exchange that took it owns it.
type fdConn struct {
	net.Conn
	fd uintptr
}

// keepFD wraps c with its descriptor, if it has one.
func keepFD(c net.Conn) net.Conn {
	rc := rawConn(c)
	if rc == nil {
		return c
	}
	var fd uintptr
	if rc.Control(func(d uintptr) { fd = d }) != nil {
		return c
	}
	return &fdConn{Conn: c, fd: fd}
}

// withFD gives c (a connection layered over raw, such as TLS) raw's
// descriptor, when keepFD kept one: the peek looks at the socket beneath.
func withFD(c, raw net.Conn) net.Conn {
	if fc, ok := raw.(*fdConn); ok {
		return &fdConn{Conn: c, fd: fc.fd}
	}
	return c
}

// connClosedByPeer peeks, without blocking or consuming anything, at a
// pooled connection: an end of file (or stray bytes, or an error) means it
// must not carry a request. A Go read with a past deadline would not reach
// the socket at all, hence the raw recv.
func connClosedByPeer(c net.Conn) bool {
	if fc, ok := c.(*fdConn); ok {
		return peekClosed(fc.fd)
	}
	rc := rawConn(c)
	if rc == nil {
		return false
	}
	closed := false
	_ = rc.Read(func(fd uintptr) bool {
		closed = peekClosed(fd)
		return true
	})
	return closed
}

// rawConn is c's raw connection, or nil if it has none.
func rawConn(c net.Conn) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// peekClosed is the peek itself. recvfrom without a source address:
// unix.Recvfrom would allocate one on every call. Only "nothing to read
// yet" means open: end of file (0 bytes), stray bytes and any other error
// all mean closed.
func peekClosed(fd uintptr) bool {
	var buf [1]byte
	_, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return errno != unix.EAGAIN
}
