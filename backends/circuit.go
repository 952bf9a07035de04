package backends

import (
	"sync"
	"sync/atomic"
	"time"
)

// circuit tracks a backend's health from probes and from two passive
// signals: failures to connect, and requests whose first byte did not come
// in time. It is closed (healthy) until threshold consecutive failures —
// or threshold consecutive first-byte timeouts — open it.
//
// A circuit that failures opened is closed by the next passing probe: the
// health check is its trial, so it never half-opens to traffic. Letting
// traffic try a backend that failed to connect would, behind a dispatcher
// that binds waiters late, send it every waiter that fits its empty GPU at
// once, to fail together.
//
// A circuit that timeouts opened is closed only by a request that was
// answered, not by a probe (a backend that answers /health while its
// completions hang is not healthy), so after cooldown it is half-open:
// traffic is let through, an answered request closes it and another
// timeout (or failure) opens it again for another cooldown.
type circuit struct {
	threshold int
	cooldown  time.Duration
	now       func() time.Time

	// timedOut is set while timeouts > 0 or timeouts opened the circuit,
	// so that the common answered() — every request — takes no lock.
	timedOut atomic.Bool

	mu         sync.Mutex // guards the fields below
	failures   int        // consecutive failed probes and connects
	timeouts   int        // consecutive first-byte timeouts of requests
	open       bool
	byTimeouts bool // the open circuit was opened by timeouts
	openedAt   time.Time
	lastErr    string
}

// CircuitState is a circuit's state as operators see it.
type CircuitState string

// The states of a backend's circuit.
const (
	StateClosed   CircuitState = "closed"
	StateOpen     CircuitState = "open"
	StateHalfOpen CircuitState = "half-open"
)

// success records a passed probe (or connection): it closes a circuit that
// failures opened, not one that timeouts did.
func (c *circuit) success() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures = 0
	if !c.open || !c.byTimeouts {
		c.open, c.lastErr = false, ""
	}
}

// answered records a request whose first byte arrived: the backend serves.
func (c *circuit) answered() {
	if !c.timedOut.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timedOut.Store(false)
	c.timeouts = 0
	if c.open && c.byTimeouts {
		c.open, c.byTimeouts, c.failures, c.lastErr = false, false, 0, ""
	}
}

// failure records one failed probe or connect and reports whether it
// opened the circuit.
func (c *circuit) failure(err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures++
	return c.countLocked(err, c.failures, false)
}

// timeout records a request whose first byte did not come in time and
// reports whether it opened the circuit.
func (c *circuit) timeout(err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timeouts++
	c.timedOut.Store(true)
	return c.countLocked(err, c.timeouts, true)
}

func (c *circuit) countLocked(err error, consecutive int, byTimeouts bool) bool {
	if err != nil {
		c.lastErr = err.Error()
	}
	if c.open {
		if c.now().Sub(c.openedAt) >= c.cooldown { // a half-open trial failed
			c.openedAt = c.now()
		}
		return false
	}
	if consecutive >= c.threshold {
		c.open, c.byTimeouts, c.openedAt = true, byTimeouts, c.now()
		return true
	}
	return false
}

func (c *circuit) state() CircuitState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stateLocked()
}

func (c *circuit) stateLocked() CircuitState {
	switch {
	case !c.open:
		return StateClosed
	case c.byTimeouts && c.now().Sub(c.openedAt) >= c.cooldown:
		return StateHalfOpen
	}
	return StateOpen
}
