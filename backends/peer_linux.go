//go:build linux

package backends

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// connClosedByPeer peeks, without blocking or consuming anything, at a
// pooled connection: an end of file (or stray bytes, or an error) means it
// must not carry a request. A Go read with a past deadline would not reach
// the socket at all, hence the raw recv.
func connClosedByPeer(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var buf [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		closed = !errors.Is(err, unix.EAGAIN) || n > 0
		return true
	})
	return closed
}
