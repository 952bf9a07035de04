//go:build !linux

package backends

import "net"

// connClosedByPeer cannot peek portably here; a write that fails on a
// pooled connection is still retried on a fresh one.
func connClosedByPeer(net.Conn) bool { return false }
