package gateway

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// The request context, as the standard library's would behave: Err and
// Cause by how it ended, Done whether asked for before or after, the
// upstream connection closed and derived contexts cancelled when it ends,
// and nothing of the kind once a connection was handed back.
func TestReqCtx(t *testing.T) {
	for _, c := range []struct {
		cause error
		err   error
	}{
		{errClientGone, context.Canceled},
		{errRequestTimeout, context.DeadlineExceeded},
		{errFirstByteTimeout, context.Canceled},
		{errShutdown, context.Canceled},
		{context.Canceled, context.Canceled},
	} {
		t.Run(c.cause.Error(), func(t *testing.T) {
			var rc reqCtx
			ctx := context.Context(&rc)
			if ctx.Err() != nil || rc.Cause() != nil {
				t.Fatal("a fresh context has ended")
			}
			early := ctx.Done()
			held, handed := &closer{}, &closer{}
			rc.Interrupt(handed)
			if !rc.Uninterrupt() {
				t.Fatal("Uninterrupt of a live context said it ended")
			}
			rc.Interrupt(held)
			child, cancelChild := context.WithTimeout(ctx, time.Hour)
			defer cancelChild()
			ran := make(chan struct{})
			context.AfterFunc(ctx, func() { close(ran) })
			stopped := context.AfterFunc(ctx, func() { t.Error("a stopped AfterFunc ran") })
			if !stopped() {
				t.Fatal("stop of a pending AfterFunc said it had run")
			}

			rc.cancel(c.cause)
			rc.cancel(errShutdown) // the first end stands
			<-early
			<-ctx.Done()
			<-child.Done()
			<-ran
			if !errors.Is(ctx.Err(), c.err) || rc.Cause() != c.cause {
				t.Errorf("Err %v Cause %v, want %v %v", ctx.Err(), rc.Cause(), c.err, c.cause)
			}
			if held.n.Load() != 1 || handed.n.Load() != 0 {
				t.Errorf("closed the held connection %d times, the one handed back %d times", held.n.Load(), handed.n.Load())
			}
			if rc.Uninterrupt() {
				t.Error("Uninterrupt after the end said the connection was not closed")
			}
			late := &closer{}
			rc.Interrupt(late)
			if late.n.Load() != 1 {
				t.Error("a connection given to an ended context was not closed at once")
			}
		})
	}
}

type closer struct{ n atomic.Int32 }

func (c *closer) Close() error { c.n.Add(1); return nil }

var _ io.Closer = (*closer)(nil)

// Asking for the done channel is what a wait does, and it wakes the sweep
// (once, without blocking) so that the waiting client is watched in time;
// what a request admitted at once does (Err, Cause, Deadline) does not.
func TestReqCtxWaitingWakesTheSweep(t *testing.T) {
	wake := make(chan struct{}, 1)
	woken := func() bool {
		select {
		case <-wake:
			return true
		default:
			return false
		}
	}
	rc := reqCtx{waiting: wake}
	rc.Err()
	rc.Cause()
	rc.Deadline()
	if woken() {
		t.Fatal("the sweep was woken by a request that did not wait")
	}
	wake <- struct{}{} // the sweep has a wake pending already: Done must not block
	rc.Done()
	if !woken() || woken() {
		t.Fatal("a pending wake was lost or doubled")
	}
	rc.Done()
	if woken() {
		t.Error("a second Done woke the sweep again")
	}

	fresh := reqCtx{waiting: wake}
	fresh.Done()
	if !woken() {
		t.Error("the first Done did not wake the sweep")
	}
	ended := reqCtx{waiting: wake}
	ended.cancel(errClientGone)
	if ended.Done() != closedChan || woken() {
		t.Error("a context ended before anyone waited woke the sweep")
	}
}

// preempt cuts the upstream exchange but not the request: the connection
// is closed and never handed back to the pool as one whose answer was read
// whole, the context lives on, and the next exchange's connection is the
// pool's again once it is done. Without an exchange, or once the request
// has ended, there is nothing to cut.
func TestReqCtxPreempt(t *testing.T) {
	var rc reqCtx
	if rc.preempt() {
		t.Fatal("preempted without an upstream exchange")
	}
	first, second := &closer{}, &closer{}
	rc.Interrupt(first)
	if !rc.preempt() || first.n.Load() != 1 {
		t.Fatalf("preempt: the connection closed %d times, want once", first.n.Load())
	}
	if rc.Err() != nil || rc.Cause() != nil {
		t.Fatal("preempt ended the request")
	}
	if rc.Uninterrupt() {
		t.Fatal("the cut exchange's connection would go back to the pool")
	}
	rc.Interrupt(second)
	if !rc.Uninterrupt() || second.n.Load() != 0 {
		t.Fatal("the next exchange's connection is not the pool's once done")
	}
	rc.Interrupt(second)
	rc.cancel(errClientGone)
	if rc.preempt() {
		t.Fatal("preempted an ended request")
	}
}
