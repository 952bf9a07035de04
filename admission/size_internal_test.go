package admission

import (
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/admission/predict"
	"github.com/kvgate/kvgate/kvbudget"
)

// A request's size has one formula (kvbudget.GroupBlocks): the scheduler's
// Group and the forecast's Item, which keeps its own arithmetic on its hot
// path, must agree with it to the byte.
func TestSizesFollowTheOneFormula(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		g := Group{Prompt: r.IntN(20000), Cap: 1 + r.IntN(8192), Seqs: 1 + r.IntN(8), BlockTokens: []int{1, 16, 32}[r.IntN(3)], BlockBytes: 1 + r.Int64N(1<<21)}
		l := kvbudget.KVLayout{BlockSize: g.BlockTokens, BytesPerBlock: g.BlockBytes}
		want := l.GroupBytes(g.Prompt, g.Cap, g.Seqs, 0)
		if got := g.final(); got != want {
			t.Fatalf("%+v: Group.final %d, kvbudget %d", g, got, want)
		}
		it := predict.Item{Prompt: g.Prompt, Cap: g.Cap, Seqs: g.Seqs, BlockTokens: g.BlockTokens, BlockBytes: g.BlockBytes}
		if got := it.Final(); got != want {
			t.Fatalf("%+v: predict.Item.Final %d, kvbudget %d", g, got, want)
		}
		// Its shareable blocks held by its GPU's table: the ticket's own
		// size and the forecast's leave the same blocks out.
		g.Prefix = make([]uint64, g.Prompt/g.BlockTokens)
		tg := tgroup{Group: g, held: int64(g.shareable())}
		want = l.GroupBytes(g.Prompt, g.Cap, g.Seqs, tg.held)
		if got := tg.final(); got != want {
			t.Fatalf("%+v held %d: tgroup.final %d, kvbudget %d", g, tg.held, got, want)
		}
		it.HeldShared = tg.held
		if got := it.Final(); got != want {
			t.Fatalf("%+v held %d: predict.Item.Final %d, kvbudget %d", g, tg.held, got, want)
		}
	}
}
