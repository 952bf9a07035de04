package gateway

import (
	"context"
	"errors"
)

// Drain is the gateway's answer to SIGTERM, in two steps, so that no client
// is refused by a replica on its way out:
//
//  1. From the call on, /readyz (and /health) answer 503, so that load
//     balancers stop sending; the listener keeps serving everything that
//     still arrives for server.drain_delay, measured on the Options' clock,
//     and each answer asks its client to close the connection, so that
//     keep-alive clients reconnect to another replica.
//  2. Then Shutdown: the listener closes, and the requests in flight (streams
//     included) get server.shutdown_timeout to finish before they are
//     cancelled.
//
// Drain returns once /readyz has turned; the channel receives Shutdown's
// result when the gateway has stopped. A second call finds it draining
// and reports so at once.
func (s *Server) Drain() <-chan error {
	out := make(chan error, 1)
	if !s.life.draining.CompareAndSwap(false, true) {
		out <- errors.New("gateway: already draining")
		return out
	}
	sc := s.rt.Load().cfg.Server
	delay := sc.DrainDelay.D
	// Durations as text ("30s"): a JSON log would write nanoseconds.
	s.log.Info("shutting down: /readyz answers 503 while the listener serves on for drain_delay, then requests in flight get shutdown_timeout",
		"drain_delay", delay.String(), "shutdown_timeout", sc.DrainTimeout().String())
	elapsed := make(chan struct{})
	s.opt.Clock.AfterFunc(delay, func() { close(elapsed) })
	go func() {
		<-elapsed
		s.log.Info("drain_delay over: closing the listener, finishing the requests in flight",
			"in_flight", s.active.Load(), "shutdown_timeout", sc.DrainTimeout().String())
		// shutdown_timeout is a deadline on the sockets' side (fasthttp's
		// ShutdownWithContext), so it runs on the wall clock.
		ctx, cancel := context.WithTimeout(context.Background(), sc.DrainTimeout())
		defer cancel()
		out <- s.Shutdown(ctx)
	}()
	return out
}
