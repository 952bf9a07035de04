package admission

import "time"

// Applying a configuration: at New and on Reconfigure, one step under mu
// that keeps what persists (GPUs and queues matched by name, with their
// tickets) and refuses at once what the new configuration can never admit.

// Reconfigure applies a new configuration (Clock, Observer and Seed
// excepted) as one step. GPUs and queues are matched by name: a GPU that
// stays keeps its tickets, its drain measurement and its AIMD ratio (its
// capacity follows the new one as Resize would); a removed GPU takes no new
// admissions, and its tickets stay valid until released; configured again
// while any of them runs, it is that same GPU (they still hold its GPU),
// with its limit reset as a new GPU's. A queue that stays
// keeps its waiters, their places and deadlines, and what it has learned;
// the waiters of a removed queue are refused with ErrNoRoute, those of a
// removed class with ErrQueueFull, and those that can no longer ever fit
// with ErrTooLarge or ErrTenantQuota. Lowered queue bounds evict nobody.
// A changed DrainWindow restarts the drain measurements. If cfg is invalid
// nothing changes and the error names the fields.
func (s *Scheduler) Reconfigure(cfg Config) error {
	set, err := resolve(cfg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.applyLocked(set, s.clock.Now())
	s.mu.Unlock()
	return nil
}

func (s *Scheduler) applyLocked(set settings, now time.Time) {
	oldWindow := s.set.drainWindow
	s.set = set
	if s.fw.scratch.mean == nil {
		s.fw.scratch = newCurve()
	}

	// GPUs, by name.
	gpus := make([]*gpu, len(set.gpus))
	byName := make(map[string]*gpu, len(set.gpus))
	for i, pc := range set.gpus {
		p := s.gpuByName[pc.Name]
		if p == nil {
			if r := s.retired[pc.Name]; r != nil {
				// Back after a reload removed it: its running tickets
				// still hold its GPU. A limit it had was its old lease's,
				// given back when it was removed: it starts as a new GPU.
				p = r
				delete(s.retired, pc.Name)
				p.limited, p.limit = s.limits.limited, 0
				if pc.Capacity != p.nominal {
					s.resizeGPULocked(p, pc.Capacity)
				}
			} else {
				p = newGPU(pc.Name, pc.Capacity, now, set.drainWindow)
				p.limited = s.limits.limited
			}
		} else if pc.Capacity != p.nominal {
			s.resizeGPULocked(p, pc.Capacity)
		}
		p.index = i
		gpus[i] = p
		byName[pc.Name] = p
	}
	for name, p := range s.gpuByName {
		if byName[name] == nil {
			p.index = -1 // removed: its tickets release into it, nothing binds to it
			if !p.limitUntil.IsZero() {
				p.limitUntil = time.Time{}
				s.limits.horizons--
			}
			if s.retired == nil {
				s.retired = map[string]*gpu{}
			}
			s.retired[name] = p
		}
	}
	for name, p := range s.retired {
		if p.tickets == 0 {
			delete(s.retired, name) // nothing runs on it: a GPU of this name may start afresh
		}
	}
	s.gpus, s.gpuByName = gpus, byName
	if set.drainWindow != oldWindow {
		for _, p := range gpus {
			p.drain = newDrainEstimator(now, set.drainWindow)
		}
	}

	// Tenants: listed ones are permanent; the rest follow the default share.
	if s.anon == nil {
		s.anon = &tenantState{name: ""}
		s.tenants[""] = s.anon
	}
	for name := range set.tenants {
		if s.tenants[name] == nil {
			s.tenants[name] = &tenantState{name: name}
		}
	}
	for name, t := range s.tenants {
		spec, listed := set.tenants[name]
		if !listed {
			spec = tenantSpec{share: set.defaultShare, queueShare: set.defaultShare}
		}
		t.share, t.queueShare, t.permanent = spec.share, spec.queueShare, listed || name == ""
	}

	// Queues, by name; their class lines, by class name.
	queues := make([]*queue, len(set.queues))
	qByName := make(map[string]*queue, len(set.queues))
	for i, qs := range set.queues {
		q := s.queueByName[qs.name]
		if q == nil {
			q = &queue{name: qs.name}
		}
		q.spec = qs
		old := q.routes
		q.routes = q.routes[:0:0]
		for _, name := range qs.gpus {
			up := true
			for _, r := range old {
				if r.p.name == name {
					up = r.up
				}
			}
			q.routes = append(q.routes, route{p: byName[name], up: up})
		}
		s.applyClassesLocked(q, now)
		if err := q.ensureLengths(); err != nil {
			panic(err) // resolve guarantees maxLen > 0
		}
		queues[i] = q
		qByName[qs.name] = q
	}
	for name, q := range s.queueByName {
		if qByName[name] != nil {
			continue
		}
		q.removed = true
		for _, l := range q.lines {
			for w := l.head; w != nil; {
				next := w.next
				s.refuseLocked(w, now, ErrNoRoute, 0, 0)
				w = next
			}
		}
	}
	s.queues, s.queueByName = queues, qByName
	s.sweepIdleTenantsLocked()
	s.refuseImpossibleLocked(now)
	s.checkLocked(opReconfigure)
	s.dispatchLocked()
}

// applyClassesLocked rebuilds q's lines for the configured classes, keeping
// the line (and its waiters) of every class whose name stays.
func (s *Scheduler) applyClassesLocked(q *queue, now time.Time) {
	byName := make(map[string]*line, len(q.lines))
	for _, l := range q.lines {
		byName[l.name] = l
	}
	lines := make([]*line, len(s.set.classes))
	for i, spec := range s.set.classes {
		l := byName[spec.name]
		if l == nil {
			l = &line{q: q, name: spec.name, tenants: map[*tenantState]*tenantQueued{}}
		}
		delete(byName, spec.name)
		l.spec, l.index = spec, i
		lines[i] = l
	}
	for _, l := range byName { // removed classes
		for w := l.head; w != nil; {
			next := w.next
			s.refuseLocked(w, now, ErrQueueFull, 0, s.retryLocked(now, w, 0))
			w = next
		}
		l.index = -1
	}
	q.lines = lines
}
