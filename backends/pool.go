package backends

import (
	"context"
	"errors"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
)

// ErrNoBackend means no available backend serves the model: every one
// serving it has an open circuit.
var ErrNoBackend = errors.New("no healthy backend")

// Pool is the set of backends of one configuration. It is immutable; a
// reload builds a new Pool (reusing Backends whose endpoint did not change).
type Pool struct {
	all     []*Backend
	byModel map[string][]*Backend
	rr      atomic.Uint64
}

// NewPool groups backends by the models they serve.
func NewPool(bs []*Backend) *Pool {
	p := &Pool{all: bs, byModel: make(map[string][]*Backend)}
	for _, b := range bs {
		for _, m := range b.spec.Models {
			p.byModel[m] = append(p.byModel[m], b)
		}
	}
	return p
}

// Backends lists every backend in configuration order.
func (p *Pool) Backends() []*Backend { return p.all }

// Serving lists the backends configured for model.
func (p *Pool) Serving(model string) []*Backend { return p.byModel[model] }

// Pick chooses the available backend for model with the most free budget;
// among equals it rotates, so equal backends share the load. skip, if not
// nil, excludes backends already tried.
func (p *Pool) Pick(model string, skip func(*Backend) bool) (*Backend, error) {
	cands := p.byModel[model]
	n := len(cands)
	if n == 0 {
		return nil, ErrNoBackend
	}
	start := int(p.rr.Add(1) % uint64(n))
	var best *Backend
	var bestFree int64
	for i := range n {
		b := cands[(start+i)%n]
		if !b.Available() || (skip != nil && skip(b)) {
			continue
		}
		if f := b.budget.Free(); best == nil || f > bestFree {
			best, bestFree = b, f
		}
	}
	if best == nil {
		return nil, ErrNoBackend
	}
	return best, nil
}

// Serves says whether an available backend serves model: what Pick would
// find, without weighing the backends' room.
func (p *Pool) Serves(model string) bool {
	for _, b := range p.byModel[model] {
		if b.Available() {
			return true
		}
	}
	return false
}

// Ready says whether at least one backend is available.
func (p *Pool) Ready() bool {
	for _, b := range p.all {
		if b.Available() {
			return true
		}
	}
	return false
}

// Run probes every backend (health and metrics) on its interval until ctx
// ends, calling onProbe (which may be nil) after each probe with its KV
// report, ok false when there was none (a failed probe, or no scrape): a
// probe may have moved the circuit either way. The first round runs at
// once, so a fresh pool learns its backends' state quickly.
func (p *Pool) Run(ctx context.Context, onProbe func(*Backend, KVReport, bool)) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, b := range p.all {
		g.Go(func() error {
			// Rounds are due every interval on the backend's clock, as a
			// ticker's: one that falls due while a probe overruns runs
			// right after it, and the rounds after keep to the interval.
			every := min(b.spec.HealthInterval, b.spec.ScrapeInterval)
			due := make(chan struct{}, 1) // one timer at a time: the send never blocks
			fire := func() { due <- struct{}{} }
			next := b.clock.Now()
			for {
				if r, ok := b.Probe(ctx); onProbe != nil && ctx.Err() == nil {
					onProbe(b, r, ok)
				}
				next = next.Add(every)
				wait := next.Sub(b.clock.Now())
				if wait <= 0 {
					next = b.clock.Now()
					if ctx.Err() != nil {
						return nil
					}
					continue
				}
				t := b.clock.AfterFunc(wait, fire)
				select {
				case <-ctx.Done():
					t.Stop()
					return nil
				case <-due:
				}
			}
		})
	}
	return g.Wait()
}
