package sharedbudget

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fair shares. A lease grows only while the budget has room and goes back
// only when it stays idle, so under saturation the first replica to lease
// keeps what it got: with requests spread evenly by a load balancer, the
// others would serve a fraction of what it does, and their clients would
// wait and be shed. So the replicas also post their demand (held + queued,
// as the pool reports it) on a board in Redis, and each computes the
// max-min fair level L of the budget over the live demands: the largest L
// with Σ min(demand, L) ≤ budget (none while the demands fit), rounded up
// to whole chunks — leases move by whole chunks, and a level inside one
// would leave a lease above it by less than a chunk, never given back. A
// replica then admits at most L (its pool's limit is min(lease, L)) and
// tells its lessee that it wants no more than L (queued demand is cut at
// L − held), so a replica above L stops admitting there, drains down to it
// as its requests finish, and its lessee gives back the idle chunks, which
// the others, refused until then, lease; the leases, not the levels, keep
// the sum within the budget. Nothing is revoked: fairness comes at
// the pace requests finish. A replica that has no demand counts for
// nothing; one that dies leaves the board with its TTL, the same as its
// lease. While the board cannot be read the level is lifted and the lessee
// alone bounds the pool (its fallback share when Redis is down).

// A turn for a big request. Max-min fairness alone starves a request
// larger than the fair level L: its replica never leases enough to admit
// it while the others are busy, though one gateway alone would serve it in
// its turn. So each replica also posts, beside its demand, its head
// request (the one that has waited longest: Scheduler.Head): what it needs
// to be admitted (held + its charge) and since when it waits (on Redis's
// clock). A head whose charge alone is above L gets a turn, the one that
// has waited longest first (ties by replica name): its replica's level is
// that need, and the others share what is left, rounded down to chunks, so
// they stop admitting, drain as their requests end, and give back the
// chunks that its lessee then leases. Every replica computes the same
// levels from the same board. The turn ends when its head is admitted or
// leaves the queue (its deadline): bounded in time by the queue's timeout.
// Small requests on that replica are its scheduler's to backfill.

// fairScript posts one replica's demand and head on a GPU's board, and its
// tenants' holds on the GPU's tenant board (tenants.go), in one round
// trip. It returns two lists: the board's live entries, each as replica,
// demand, held, charge, since (ms on Redis's clock; 0: no head waits), and
// the other replicas' live tenant posts. Time is Redis's own, as for the
// leases. Both keys carry the GPU's hash tag, so they share a slot.
//
// KEYS[1] hash replica -> "demand expiry_ms held charge since_ms"; KEYS[2]
// (optional) hash replica -> "expiry_ms json"; ARGV: replica, demand, ttl
// ms, held, the head's charge, how long it waited, ms, the tenants' json.
var fairScript = redis.NewScript(boardPrelude + `
local held, charge, waited = tonumber(ARGV[4]) or 0, tonumber(ARGV[5]) or 0, tonumber(ARGV[6]) or 0
local since = 0
if charge > 0 then since = now - waited end
local function fmt(n) return string.format('%.0f', n) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. fmt(now + ttl) .. ' ' .. fmt(held) .. ' ' .. fmt(charge) .. ' ' .. fmt(since))
redis.call('PEXPIRE', KEYS[1], ttl)
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f = {}
  for x in string.gmatch(all[i + 1], '%S+') do table.insert(f, x) end
  if #f < 2 or tonumber(f[2]) == nil or tonumber(f[2]) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    table.insert(out, all[i])
    table.insert(out, f[1])
    table.insert(out, f[3] or '0')
    table.insert(out, f[4] or '0')
    table.insert(out, f[5] or '0')
  end
end
local tenants = {}
if KEYS[2] then
  redis.call('HSET', KEYS[2], ARGV[1], fmt(now + ttl) .. ' ' .. (ARGV[7] or '{}'))
  redis.call('PEXPIRE', KEYS[2], ttl)
  local posts = redis.call('HGETALL', KEYS[2])
  for i = 1, #posts, 2 do
    local e, v = string.match(posts[i + 1], '^(%d+) (.*)$')
    if e == nil or tonumber(e) <= now then
      redis.call('HDEL', KEYS[2], posts[i])
    elseif posts[i] ~= ARGV[1] then
      table.insert(tenants, v)
    end
  end
end
return {out, tenants}
`)

// boardEntry is one replica's post on a GPU's board.
type boardEntry struct {
	replica      string
	demand, held int64
	charge       int64 // its head's: 0 when none waits
	since        int64 // when its head began waiting, ms on Redis's clock
}

// parseBoard reads fairScript's answer; unreadable entries count for
// nothing.
func parseBoard(v []string) []boardEntry {
	var out []boardEntry
	for i := 0; i+4 < len(v); i += 5 {
		var n [4]int64
		ok := true
		for k := range n {
			var err error
			if n[k], err = strconv.ParseInt(v[i+1+k], 10, 64); err != nil {
				ok = false
			}
		}
		if ok {
			out = append(out, boardEntry{replica: v[i], demand: n[0], held: n[1], charge: n[2], since: n[3]})
		}
	}
	return out
}

// demands is each entry's demand, for fairLevel.
func demands(board []boardEntry) []int64 {
	out := make([]int64, 0, len(board))
	for _, e := range board {
		if e.demand > 0 {
			out = append(out, e.demand)
		}
	}
	return out
}

// turnLevel is the level of replica me on a board under budget, in whole
// chunks: the max-min fair level (-1: none, the demands fit), unless a head
// larger than it has a turn (see above): then its replica's level is what
// it needs (held + the head's charge), and the others' the fair level of
// what is left, rounded down. Second, whose turn it is ("" for none).
func turnLevel(budget, chunk int64, board []boardEntry, me string) (int64, string) {
	level := fairLevel(budget, demands(board))
	if level < 0 {
		return -1, ""
	}
	up := func(n int64) int64 { return (n + chunk - 1) / chunk * chunk }
	var turn *boardEntry
	for i := range board {
		e := &board[i]
		// Larger than the fair level, and not admissible at it (in chunks).
		if e.charge <= level || e.held+e.charge <= up(level) || e.since <= 0 || e.charge > budget {
			continue
		}
		if turn == nil || e.since < turn.since || (e.since == turn.since && e.replica < turn.replica) {
			turn = e
		}
	}
	if turn == nil {
		return up(level), ""
	}
	need := min(up(turn.held+turn.charge), budget)
	if turn.replica == me {
		return need, turn.replica
	}
	var rest []boardEntry
	for _, e := range board {
		if e.replica != turn.replica {
			rest = append(rest, e)
		}
	}
	left := budget - need
	if l := fairLevel(left, demands(rest)); l >= 0 {
		left = l
	}
	return left / chunk * chunk, turn.replica
}

// boardPrelude begins the boards' scripts: now on Redis's clock, in ms,
// and the entries' TTL, their ARGV[3].
const boardPrelude = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
`

func (f *Replica) boardKey(gpu string) string { return f.cfg.KeyPrefix + "{" + gpu + "}:demand" }

func (f *Replica) tenantKey(gpu string) string { return f.cfg.KeyPrefix + "{" + gpu + "}:tenants" }

// boardReply splits fairScript's answer into the board's fields and the
// tenant posts.
func boardReply(v []any) (board, tenants []string, err error) {
	if len(v) != 2 {
		return nil, nil, fmt.Errorf("fair board: %d lists in the answer, want 2", len(v))
	}
	if board, err = stringList(v[0]); err == nil {
		tenants, err = stringList(v[1])
	}
	return board, tenants, err
}

func stringList(v any) ([]string, error) {
	l, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("fair board: %T in the answer, want a list", v)
	}
	out := make([]string, len(l))
	for i, x := range l {
		if out[i], ok = x.(string); !ok {
			return nil, fmt.Errorf("fair board: %T in a list, want a string", x)
		}
	}
	return out, nil
}

// fairLevel is the max-min fair level of budget over demands: the largest
// L with Σ min(d, L) ≤ budget, or -1 (none) when they all fit.
func fairLevel(budget int64, demands []int64) int64 {
	d := slices.Clone(demands)
	slices.Sort(d)
	left := budget
	for i, v := range d {
		share := left / int64(len(d)-i)
		if v > share {
			return share
		}
		left -= v
	}
	return -1
}

// runFair posts this replica's demands and applies the levels every
// period, until ctx ends.
func (f *Replica) runFair(ctx context.Context, period time.Duration) {
	t := newTicker(f.clock, period)
	for t.wait(ctx) {
		for _, pl := range *f.byPool.Load() {
			f.fairStep(ctx, pl)
		}
		f.reapDrained()
	}
}

// fairStep posts pl's demand and its tenants' holds, applies the level the
// board gives, and counts what the other replicas hold for each tenant.
func (f *Replica) fairStep(ctx context.Context, pl *poolLease) {
	held, queued := f.sched.Demand(pl.pool)
	budget := pl.budget.Load()
	st := pl.l.Stats()
	if b := st.Budget; b > 0 && b < budget {
		budget = b // the fleet's budget: the smallest announced
	}
	// Silent replicas' residual holds are nobody's to share: the live
	// replicas' fair parts are of what is left.
	budget = max(0, budget-st.Residual)
	demand := pl.recentDemand(min(held+queued, budget))
	charge, waited := f.sched.Head(pl.pool)
	cctx, cancel := context.WithTimeout(ctx, f.cfg.LeaseTTL.D/3)
	start := f.clock.Now()
	res, err := fairScript.Run(cctx, f.client, []string{f.boardKey(pl.gpu), f.tenantKey(pl.gpu)},
		f.cfg.Replica, demand, f.cfg.LeaseTTL.D.Milliseconds(), held, charge, waited.Milliseconds(), f.tenantPost(pl)).Slice()
	cancel()
	var v, tenants []string
	if err == nil {
		v, tenants, err = boardReply(res)
	}
	f.observe("demand", f.clock.Now().Sub(start), err)
	level := int64(-1)
	var board []int64
	if err == nil {
		_ = f.sched.SetTenantsElsewhere(pl.pool, sumTenants(tenants)) // a pool a reload removed has none to set
		b := parseBoard(v)
		var turn string
		level, turn = turnLevel(budget, pl.chunk, b, f.cfg.Replica)
		board = demands(b)
		if turn != pl.turn {
			if turn != "" {
				f.log.Info("a big request's turn on a GPU: its replica leases what it needs while the others hold back",
					"gpu", pl.gpu, "turn", turn, "level", level)
			}
			pl.turn = turn
		}
	}
	if pl.level.Swap(level) != level {
		pl.apply(f.sched)
		pl.l.Wake() // the demand it should lease for changed
	}
	// The forecast's safety margin is the GPU's, shared by the replicas'
	// independent batches; without the board (Redis unreachable) each
	// keeps a whole one.
	margin := 1.0
	if err == nil {
		margin = 1 / math.Sqrt(independentBatches(atLevel(board, level)))
	}
	if margin != pl.margin {
		pl.margin = margin
		_ = f.sched.SetMargin(pl.pool, margin) // a pool a reload removed has none to set
	}
}

// atLevel is what each replica on the board runs: its demand, cut at the
// fair level when there is one.
func atLevel(demands []int64, level int64) []int64 {
	out := make([]int64, 0, len(demands))
	for _, n := range demands {
		if n > 0 {
			if level >= 0 {
				n = min(n, level)
			}
			out = append(out, n)
		}
	}
	return out
}

// independentBatches is how many equal, independent batches the replicas'
// shares of a GPU amount to for the spread of its memory: a batch's
// standard deviation grows as the square root of its size, so k margins of
// z/√k cover the GPU's whole batch when k = (Σ√aᵢ)² / Σaᵢ — k for k equal
// shares, 1 when one replica runs everything. With no share known it is 1:
// a whole margin.
func independentBatches(shares []int64) float64 {
	var roots, sum float64
	for _, a := range shares {
		if a > 0 {
			roots += math.Sqrt(float64(a))
			sum += float64(a)
		}
	}
	if sum == 0 {
		return 1
	}
	return max(1, roots*roots/sum)
}

// demandWindow is how many fair steps a demand is remembered: a replica
// posts the largest of its last ones, so that the moment between a batch
// finishing and its clients sending the next (a queue briefly empty) does
// not lift the level and let another replica lease past it.
const demandWindow = 3

// recentDemand records d and returns the largest of the last demandWindow
// demands. Only the fair-share loop calls it.
func (pl *poolLease) recentDemand(d int64) int64 {
	pl.recent[pl.recentAt%demandWindow] = d
	pl.recentAt++
	return slices.Max(pl.recent[:])
}

// leaveBoard takes this replica off pl's boards (at shutdown, its lease
// given back), so that the others need not wait for its entries' TTL.
func (f *Replica) leaveBoard(ctx context.Context, pl *poolLease) {
	_ = f.client.HDel(ctx, f.boardKey(pl.gpu), f.cfg.Replica).Err()
	_ = f.client.HDel(ctx, f.tenantKey(pl.gpu), f.cfg.Replica).Err()
}
