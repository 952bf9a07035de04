package admission

import (
	"fmt"
	"math"
	"time"

	"github.com/kvgate/kvgate/kvbudget"
)

// Request is one request for admission.
type Request struct {
	// Queue names a configured queue (the gateway: the model). Its GPUs are
	// the ones the request may be bound to.
	Queue string
	// Class names a configured class; "" = Config.DefaultClass.
	// An unknown class is an error, not a refusal.
	Class string
	// Tenant is who pays; "" = the anonymous tenant, bounded by
	// Config.DefaultTenantShare like any unlisted tenant.
	Tenant string
	// Deadline bounds the time in the queue; zero = the class's QueueTimeout
	// only. The effective deadline is the earlier of the two.
	Deadline time.Time
	// Shape is how the request's hold grows as it runs, one Group per
	// prompt. With a Shape, the weight is derived from it and Weight must be
	// 0. Without one, the request holds Weight (> 0) throughout, whatever
	// the policy: the way to count requests rather than bytes.
	Shape  []Group
	Weight int64
	// Opaque says the caller will not report progress (a non-streamed
	// answer): under Predicted the request is then taken at the size its
	// learned length gives, from admission to release.
	Opaque bool
	// Pinned says the request itself sets its output's length (vLLM's
	// ignore_eos, or a min_tokens floor): every sequence is taken to run
	// to its cap — under Predicted, growing as its progress says (its
	// worst case at every step, not from the start); otherwise held at
	// its worst case — and its length teaches no predictor, since it says
	// nothing of how long the model's answers run.
	Pinned bool
	// Stopper, if set, is how the scheduler stops the running request to
	// keep its GPU's memory within its capacity when the forecast was
	// wrong (see guard.go). Only requests that report their progress are
	// ever stopped.
	Stopper Stopper
	// NoResume says the request cannot be resumed once stopped (its
	// caller would have to fail it): the guard stops it only after every
	// stream that can be (a Stopper that is a ResumableStopper saying so),
	// and while its queue's forecast is in doubt when it is admitted
	// (warm-up, a cool-down) it is held at its worst case for its whole
	// run rather than forecast once the doubt ends.
	NoResume bool
	// Resumes, when set, is the ticket of a request the guard stopped that
	// this one continues (the caller re-sends it with what it had
	// generated): it waits at that request's place in its queue, by arrival
	// order, not behind everything that came since — its client has been
	// waiting all along.
	Resumes *Ticket
	// Affinity, when not 0, names the GPU the request prefers among those
	// that fit (routing by session or prompt prefix): the same value picks
	// the same GPU while it fits.
	Affinity uint64
}

// Group is one prompt of a request and the sequences generated from it.
// Sizes are in blocks of BlockTokens tokens of BlockBytes each: a sequence
// holds ceil(tokens / BlockTokens) blocks, and the Seqs sequences of a group
// share the prompt's full blocks (parallel sampling). A step of a running
// request is one generated token per live sequence.
type Group struct {
	Prompt      int   // prompt tokens; >= 0
	Cap         int   // the most tokens each sequence may generate; >= 1
	Seqs        int   // sequences; >= 1
	BlockTokens int   // >= 1
	BlockBytes  int64 // >= 1
	// Prefix names the prompt's leading full blocks by content, for a GPU
	// that holds a shared block once (SetSharing): Prefix[j] stands for
	// blocks 0 to j — a hash chained over their tokens and whatever else
	// the backend's sharing depends on (the model, a cache salt), equal
	// for two requests only if the backend would share those blocks. nil:
	// the request shares nothing. Only the blocks before the prompt's last
	// token count (share.go).
	Prefix []uint64
}

func (g Group) validate(i int) error {
	switch {
	case g.Prompt < 0:
		return fmt.Errorf("shape[%d].prompt: %d must be >= 0", i, g.Prompt)
	case g.Cap < 1:
		return fmt.Errorf("shape[%d].cap: %d must be >= 1", i, g.Cap)
	case g.Seqs < 1:
		return fmt.Errorf("shape[%d].seqs: %d must be >= 1", i, g.Seqs)
	case g.BlockTokens < 1:
		return fmt.Errorf("shape[%d].block_tokens: %d must be >= 1", i, g.BlockTokens)
	case g.BlockBytes < 1:
		return fmt.Errorf("shape[%d].block_bytes: %d must be >= 1", i, g.BlockBytes)
	}
	return nil
}

// blocks is ceil(tokens / per), saturating.
func blocks(tokens int, per int) int64 {
	if tokens <= 0 {
		return 0
	}
	return int64((tokens-1)/per) + 1
}

// size is the bytes a group holds with live sequences that have generated
// g tokens each: the shared full prompt blocks, and each sequence's own, by
// kvbudget's one formula. It saturates at math.MaxInt64.
func (g Group) size(live, generated int) int64 {
	if live <= 0 {
		return 0
	}
	return satMul(kvbudget.GroupBlocks(g.Prompt, generated, live, g.BlockTokens, 0), g.BlockBytes)
}

// final is the group's worst case: every sequence at its cap.
func (g Group) final() int64 { return g.size(g.Seqs, g.Cap) }

// WorstCaseBytes is the bytes a request of these groups holds at its worst case,
// sharing nothing: the weight admission compares with a GPU's budget, and
// so the figure a refusal quotes. It saturates at math.MaxInt64.
func WorstCaseBytes(shape []Group) int64 {
	var w int64
	for _, g := range shape {
		w = satAdd64(w, g.final())
	}
	return w
}

func satAdd(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

func satAdd64(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}
