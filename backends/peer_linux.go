//go:build linux

package backends

import (
	"net"
	"syscall"
	"unsafe"

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
		// recvfrom without a source address: unix.Recvfrom would allocate
		// one on every call.
		// Only "nothing to read yet" means open: end of file (0 bytes),
		// stray bytes and any other error all mean closed.
		_, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), 1,
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		closed = errno != unix.EAGAIN
		return true
	})
	return closed
}
