package backends

import (
	"sync"
	"time"
)

// circuit tracks a backend's health from probes and from the passive signal
// of transport errors. It is closed (healthy) until threshold consecutive
// failures open it; after cooldown it is half-open: traffic and probes are
// let through, the first success closes it and a failure opens it again for
// another cooldown.
type circuit struct {
	threshold int
	cooldown  time.Duration
	now       func() time.Time

	mu       sync.Mutex // guards the fields below
	failures int
	open     bool
	openedAt time.Time
	lastErr  string
}

// CircuitState is a circuit's state as operators see it.
type CircuitState string

// The states of a backend's circuit.
const (
	StateClosed   CircuitState = "closed"
	StateOpen     CircuitState = "open"
	StateHalfOpen CircuitState = "half-open"
)

func (c *circuit) success() {
	c.mu.Lock()
	c.failures, c.open, c.lastErr = 0, false, ""
	c.mu.Unlock()
}

// failure records one failure and reports whether it opened the circuit.
func (c *circuit) failure(err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures++
	if err != nil {
		c.lastErr = err.Error()
	}
	if c.open {
		if c.now().Sub(c.openedAt) >= c.cooldown { // a half-open trial failed
			c.openedAt = c.now()
		}
		return false
	}
	if c.failures >= c.threshold {
		c.open, c.openedAt = true, c.now()
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
	case c.now().Sub(c.openedAt) >= c.cooldown:
		return StateHalfOpen
	}
	return StateOpen
}
