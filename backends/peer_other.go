//go:build !linux

package backends

import "net"

// connClosedByPeer cannot peek portably here; a write that fails on a
// pooled connection is still retried on a fresh one.
func connClosedByPeer(net.Conn) bool { return false }

// keepFD has nothing to keep where connClosedByPeer cannot peek.
func keepFD(c net.Conn) net.Conn { return c }

// withFD has no descriptor to carry over.
func withFD(c, _ net.Conn) net.Conn { return c }
