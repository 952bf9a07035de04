package backends

import (
	"errors"
	"testing"
	"time"
)

// Issue 12, item 4: a backend that passes its health checks while its
// completions hang is not healthy. Consecutive first-byte timeouts open the
// circuit; passing probes neither reset the count nor close a circuit that
// timeouts opened; only an answered request does.
func TestCircuitTimeouts(t *testing.T) {
	type step struct {
		do   string // timeout, answered, probe-ok, probe-fail, advance
		want CircuitState
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"probes between timeouts do not reset them", []step{
			{"timeout", StateClosed}, {"probe-ok", StateClosed}, {"timeout", StateOpen},
		}},
		{"an answer resets the count", []step{
			{"timeout", StateClosed}, {"answered", StateClosed}, {"timeout", StateClosed}, {"timeout", StateOpen},
		}},
		{"a passing probe does not close what timeouts opened", []step{
			{"timeout", StateClosed}, {"timeout", StateOpen}, {"probe-ok", StateOpen},
			{"advance", StateHalfOpen}, {"probe-ok", StateHalfOpen}, {"answered", StateClosed},
		}},
		{"a half-open trial that times out opens it again", []step{
			{"timeout", StateClosed}, {"timeout", StateOpen}, {"advance", StateHalfOpen}, {"timeout", StateOpen},
		}},
		{"failures open it; a passing probe, not the cooldown, closes it", []step{
			{"probe-fail", StateClosed}, {"probe-fail", StateOpen}, {"advance", StateOpen}, {"probe-fail", StateOpen},
			{"advance", StateOpen}, {"probe-ok", StateClosed},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			b := mustBackend(t, "a", []string{"m"}, budgetOf(1), c)
			for i, s := range tt.steps {
				switch s.do {
				case "timeout":
					b.ReportTimeout(errors.New("first byte timeout"))
				case "answered":
					b.ReportAnswered()
				case "probe-ok":
					b.ReportSuccess()
				case "probe-fail":
					b.ReportFailure(errors.New("health: status 503"))
				case "advance":
					c.Advance(5 * time.Second)
				}
				if got := b.State(); got != s.want {
					t.Fatalf("step %d (%s): %s, want %s", i, s.do, got, s.want)
				}
			}
		})
	}
}
