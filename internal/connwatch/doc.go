// Package connwatch tells a server that the client of a request has hung up
// while the server is not reading from its connection.
//
// fasthttp runs a handler on the connection's goroutine and reads nothing
// from the socket meanwhile, so a request waiting in an admission queue, or
// waiting for a non-streaming upstream answer, would never learn that its
// client left (fasthttp issues #468, #874, #965). A Watcher registers the
// connection's file descriptor, without reading from it, in an epoll set of
// its own for EPOLLRDHUP (the peer closed or shut down its side), EPOLLHUP
// and EPOLLERR, and calls the request's callback once when one of them fires.
//
// Invariants: a callback runs at most once, never after its stop function has
// returned, and never for a connection registered later under the same fd
// number (registrations carry a generation). Stop must be called before the
// connection is closed or handed back to the server. One goroutine serves all
// connections of a Watcher. On systems without epoll, and for connections
// that are not backed by a socket (TLS wrappers, in-memory pipes), Watch
// returns ErrUnsupported and callers carry on without hang-up detection.
//
// Limitation: a client that half-closes its sending side (shutdown(SHUT_WR))
// while still waiting for the answer is reported as gone: the kernel tells
// the two apart only once the server writes. Few HTTP clients do that;
// netcat -N does. The gateway holds the report back while a stream is under
// way (its writes tell a client that is gone) and answers a request it
// cancelled for a hang-up with an error, so such a client never takes a
// cut answer for a whole one.
package connwatch
