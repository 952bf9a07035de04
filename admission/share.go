package admission

import (
	"fmt"
	"slices"
	"sort"

	"github.com/kvgate/kvgate/kvbudget"
)

// Shared prompt blocks. A backend with a prefix cache (vLLM's automatic
// prefix caching) holds a full prompt block once for every running request
// whose prompt begins with the same tokens. A GPU that shares (SetSharing)
// keeps a table of the blocks its tickets hold, by content, with reference
// counts: a ticket's own weight leaves its shareable blocks out, and the
// GPU counts each of them once, from its first holder's admission to its
// last holder's release, whoever admitted it. A request fits on what it
// adds now: its own part and the blocks the table does not hold yet. Once
// admitted it is a holder itself, so no other holder's release can take a
// block from under it; and a request that waits while the holders of its
// blocks end finds them gone, and needs its whole size again. Among its
// GPUs with room, it goes where it adds least (dispatch.go).
//
// Never under-count: a block is counted as shared only if the caller's
// Prefix says it is the same content on a backend that shares it. The
// last prompt token is always computed again by vLLM, so a block that
// holds it is never taken as shared.

// shareable is how many of g's leading prompt blocks may be held once for
// several requests: full blocks the prompt's last token is not in.
func (g Group) shareable() int {
	if g.Prompt <= 1 || len(g.Prefix) == 0 {
		return 0
	}
	return min(len(g.Prefix), (g.Prompt-1)/g.BlockTokens)
}

// size is what the group holds of its own: kvbudget's one formula, less
// the prompt blocks its GPU's table counts (held).
func (g *tgroup) size(live, generated int) int64 {
	if live <= 0 {
		return 0
	}
	return satMul(kvbudget.GroupBlocks(g.Prompt, generated, live, g.BlockTokens, g.held), g.BlockBytes)
}

// final is the group's own worst case: every sequence at its cap.
func (g *tgroup) final() int64 { return g.size(g.Seqs, g.Cap) }

// SetSharing says whether gpu's backends hold a prompt block once for
// every request that shares it, so that its requests' Prefix counts. It
// applies to the requests admitted from now on; what the table holds stays
// until its holders are released.
func (s *Scheduler) SetSharing(gpu string, on bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.gpuByName[gpu]
	if p == nil {
		return fmt.Errorf("admission: set sharing: unknown GPU %q", gpu)
	}
	p.sharing = on
	return nil
}

// shareLocked enters t's shareable blocks, runs[i] of its group i (as the
// fit counted them: shareRunsLocked), into p's table and makes t's weight
// its own; the blocks new to the table are held by p once.
func (s *Scheduler) shareLocked(p *gpu, t *Ticket, runs []int) {
	var added, counted int64
	for i := range t.groups {
		g := &t.groups[i]
		m := runs[i]
		if m == 0 {
			continue
		}
		for _, h := range g.Prefix[:m] {
			if p.table.inc(h) {
				added = satAdd64(added, g.BlockBytes)
			} else {
				p.hits.held++
			}
		}
		p.hits.prompt += int64(m)
		g.held = int64(m)
		counted = satAdd64(counted, satMul(int64(m), g.BlockBytes))
	}
	if counted == 0 {
		return
	}
	var own int64
	for i := range t.groups {
		own = satAdd64(own, t.groups[i].final())
	}
	// The charge loses what the weight loses: the shared blocks are held
	// throughout, so they are part of the forecast's peak as of the worst
	// case. The first Progress computes it from the ticket's own forecast.
	t.weight = own
	t.charge = min(max(t.charge-counted, 1), own)
	p.sharedRefs = satAdd64(p.sharedRefs, counted)
	s.tableLocked(p, added)
}

// unshareLocked takes t's blocks out of p's table; those it held last
// leave p.
func (s *Scheduler) unshareLocked(p *gpu, t *Ticket) {
	var freed int64
	for i := range t.groups {
		g := &t.groups[i]
		if g.held == 0 {
			continue
		}
		for _, h := range g.Prefix[:g.held] {
			if p.table.dec(h) {
				freed += g.BlockBytes
			}
		}
		p.sharedRefs -= g.held * g.BlockBytes
		g.held = 0
	}
	if freed != 0 {
		s.tableLocked(p, -freed)
	}
}

// tableLocked moves p's accounts by d bytes of table: held, the charge,
// what it may hold now (the guard) and, under Predicted, its forecast, in
// which a block is held throughout — until its last holder ends, which
// comes no sooner than any one holder's end.
func (s *Scheduler) tableLocked(p *gpu, d int64) {
	p.tableBytes += d
	p.held += d
	p.charge += d
	p.now += d
	if s.set.policy.predicted {
		if p.fc.mean == nil {
			p.fc = newCurve()
		}
		p.fc.addConst(float64(d), 0, float64(d))
		s.forecastChangedLocked(p)
	}
}

// sharesLocked says whether the table counts any of t's blocks.
func (t *Ticket) sharesLocked() bool {
	for i := range t.groups {
		if t.groups[i].held != 0 {
			return true
		}
	}
	return false
}

// sharedOf is the bytes of shape's shareable blocks.
func sharedOf(shape []Group) int64 {
	var b int64
	for _, g := range shape {
		b = satAdd64(b, satMul(int64(g.shareable()), g.BlockBytes))
	}
	return b
}

// shareOnLocked is what p would count of w's shareable blocks once for
// several holders (shared), and what of it p's table would gain (fresh):
// those no ticket of p holds now. The blocks of a prompt that p holds are
// a leading run (a ticket holds a leading run of its blocks, and a name
// stands for its whole prefix), so a binary search finds where it ends.
func (s *Scheduler) shareOnLocked(p *gpu, w *waiter) (shared, fresh int64, runs []int) {
	runs = s.shareRunsLocked(p, w)
	for i, g := range w.shape {
		m := runs[i]
		held := sort.Search(m, func(j int) bool { return p.table.get(g.Prefix[j]) == 0 })
		shared = satAdd64(shared, satMul(int64(m), g.BlockBytes))
		fresh = satAdd64(fresh, satMul(int64(m-held), g.BlockBytes))
	}
	return shared, fresh, runs
}

// ownCurveLocked is w's forecast as a ticket of a sharing GPU would hold it
// of its own: without the shareable blocks the GPU's table counts, runs[i]
// of group i. Like waiterCurveLocked, it is computed once per request,
// predictor and runs.
func (s *Scheduler) ownCurveLocked(w *waiter, runs []int) curve {
	c := &s.fw.own
	if c.mean == nil {
		*c = newCurve()
	} else if s.fw.ownSeq == w.seq && s.fw.ownLens == w.lens && s.fw.ownOpaque == w.opaque && w.seq != 0 && slices.Equal(s.fw.ownRuns, runs) {
		return *c
	}
	s.fw.ownSeq, s.fw.ownLens, s.fw.ownOpaque = w.seq, w.lens, w.opaque
	s.fw.ownRuns = append(s.fw.ownRuns[:0], runs...)
	c.zero()
	for i, g := range w.shape {
		s.groupCurveLocked(c, g, int64(runs[i]), g.Seqs, 0, w.opaque, w.lens)
	}
	return *c
}
