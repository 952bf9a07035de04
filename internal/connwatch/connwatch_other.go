//go:build !linux

package connwatch

import "net"

// Watcher is a no-op where epoll does not exist: Watch always returns
// ErrUnsupported.
type Watcher struct{}

// New returns a Watcher that supports nothing.
func New() (*Watcher, error) { return &Watcher{}, nil }

// Watch returns ErrUnsupported.
func (w *Watcher) Watch(net.Conn, func()) (func() bool, error) { return nil, ErrUnsupported }

// Close does nothing.
func (w *Watcher) Close() error { return nil }
