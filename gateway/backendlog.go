package gateway

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/kvbudget"
)

// backendLog writes what operators need to follow the backends: each change
// of a backend's circuit (up, down, on trial) and of a GPU's budget as the
// backends' reports shape it, once per change, at info. Changes are seen
// where the gateway looks: every probe, and a request that opened a circuit.
// A circuit that half-opens with time alone is therefore logged at the
// backend's next probe, within a health interval.
type backendLog struct {
	log *slog.Logger

	mu      sync.Mutex                       // guards states and budgets
	states  map[string]backends.CircuitState // backend name → last state logged (or first seen)
	budgets map[string]int64                 // GPU name → last capacity logged
}

func newBackendLog(l *slog.Logger) *backendLog {
	return &backendLog{log: l, states: map[string]backends.CircuitState{}, budgets: map[string]int64{}}
}

// observe logs b's state if it changed since b was last observed; why
// says what the gateway saw, when the state alone does not.
func (bl *backendLog) observe(b *backends.Backend, why string) {
	bl.state(b.Name(), b.State(), b.LastError(), why)
}

func (bl *backendLog) state(name string, st backends.CircuitState, lastErr, why string) {
	bl.mu.Lock()
	prev, seen := bl.states[name]
	bl.states[name] = st
	bl.mu.Unlock()
	if prev == st || !seen && st == backends.StateClosed {
		return // backends start closed: that is no news
	}
	from := string(prev)
	if !seen {
		from = "unknown"
	}
	attrs := []any{"backend", name, "from", from, "to", string(st)}
	if why != "" {
		attrs = append(attrs, "why", why)
	}
	switch st {
	case backends.StateOpen:
		if lastErr != "" {
			attrs = append(attrs, "err", lastErr)
		}
		bl.log.Info("backend down: circuit open, no requests are routed to it", attrs...)
	case backends.StateHalfOpen:
		bl.log.Info("backend on trial: circuit half-open, requests may try it", attrs...)
	default:
		bl.log.Info("backend up: circuit closed", attrs...)
	}
}

// budget logs a GPU's budget when its backends' pool is first known, and
// whenever the capacity admission uses changes after that.
func (bl *backendLog) budget(g *gpu, pool, capacity int64) {
	bl.mu.Lock()
	prev, seen := bl.budgets[g.name]
	bl.budgets[g.name] = capacity
	bl.mu.Unlock()
	switch {
	case !seen:
		bl.log.Info("GPU budget learned from its backends' KV pool", "gpu", g.name, "configured", g.nominal, "pool", pool, "capacity", capacity)
	case prev != capacity:
		bl.log.Info("GPU budget changed with its backends' KV pool", "gpu", g.name, "configured", g.nominal, "pool", pool, "from", prev, "capacity", capacity)
	}
}

// oversizeFix is the fix for a KV pool larger than g's budget, which
// depends on where the budget came from: a computed one is the ceiling's
// share of the GPU, so the backend should use as much (vLLM's
// --gpu-memory-utilization) and no more; a kv_budget is the operator's own
// number, and neither the ceiling nor the utilization enters it.
func (g *gpu) oversizeFix(pool int64) string {
	if g.budgetField != "" {
		return fmt.Sprintf("%s is below the pool the backend reports: raise it to the pool (%s), or start the backend with a KV cache of the budget's size (vLLM's --kv-cache-memory-bytes %d)",
			g.budgetField, kvbudget.FormatBytes(pool), g.nominal)
	}
	return "start the backend with --gpu-memory-utilization equal to admission.ceiling, or raise admission.ceiling"
}
