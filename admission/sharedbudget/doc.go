// Package sharedbudget is admission across processes: it shares each GPU's KV
// budget among gateway replicas (the gateway's shared_budget section), so
// that three replicas in front of one GPU admit what the GPU holds, not
// three times that. The books live in Redis; each replica leases capacity
// in chunks and admits locally inside its lease, so no request waits for a
// round trip to Redis.
//
// # The door
//
// The gateway builds a Replica with New from its validated Config (the
// shared_budget section; Config.Validate fills its defaults) and Deps (the
// clock, the logger, the request timeout, a hook for round-trip latency),
// hands it the scheduler with Start, and then tells it what changes: Sync
// with the GPUs after a reload, SetBudget when a GPU's derived budget
// moves, Wake (the scheduler's OnDemand) when a request queues. Close gives
// the leases back after the drain. What a replica needs of the scheduler
// is the Scheduler interface; it reads the lessees back through Leases
// (metrics) and Status (/status). Per GPU, a Lessee (below) holds the
// lease and sets it as the pool's limit; a fair-share loop keeps saturated
// replicas at even parts of the budget, and gives a request larger than
// its replica's part a turn at the lease it needs (fair.go), and posts
// and reads tenants' holds and demand on the same round trip, so that a
// tenant's share holds across the fleet (tenants.go); a lengths sharer exchanges
// the output lengths the replicas learn (lengths.go).
//
// Time: the lessees, the periodic loops and the round-trip timings run on
// Deps.Clock, so that tests drive them by hand; the leases themselves are
// timed by Redis's clock (below), and a call to Redis carries a context
// deadline that go-redis applies to its socket.
//
// # Model
//
// A budget key names one GPU's budget. Under it a Store keeps, per replica,
// a lease (bytes, expiry, keep) and the budget that replica announces
// (bytes, expiry). Every call from a replica renews both for the TTL it
// passes, and moves the lease's keep to its residual bound (below); an
// announcement whose expiry has passed, and a lease whose keep has, is dead
// and is purged by the next call on the key (no cron). A lease past its
// expiry but not its keep is a residual hold (below). The key's budget is the smallest live announcement:
// replicas that disagree (one saw a smaller KV pool) use the smallest, and a
// raised budget takes effect once the last replica announcing the old one
// has raised it too or its announcement has expired. Time is Redis's own
// clock (TIME inside the script); replicas' clocks are never compared.
//
// Redis keeps a key's books in seven Redis keys sharing one hash tag
// (prefix + "{key}:leases", ":leases:exp", ":leases:keep", ":budgets",
// ":budgets:exp", ":ops", ":holds"), so they live in one Cluster slot, and each
// expires with its last entry. One Lua script (lease.lua) makes every change. Memory keeps the
// same books in process: it is the reference in tests and the store of a
// gateway that runs alone. Both pass one contract suite.
//
// # The script's invariant
//
// A grant is made only while leases + residual holds + grant ≤ the key's
// budget, in one atomic step with the purge that decides what still counts.
// So they never exceed the budget, except when the budget is lowered under
// leases already granted: nothing is revoked then, nothing more is granted
// until the leases fit, and Lessees scale their capacity down meanwhile
// (below).
// A release never returns more than the replica holds. A client that sends
// a call again (go-redis retries when a connection breaks after the script
// ran) is answered from the record of the first run, never served twice.
//
// # The Lessee
//
// A Lessee holds one replica's lease on one GPU and turns it into the
// capacity of the local admission pool, through OnCapacity. The pool never
// revokes weight it holds; a lower capacity only stops admissions. The
// lessee reads the pool's demand (held + queued weight) from its own
// goroutine, woken by the pool's Wake (a non-blocking send) and by its own
// timers; no request waits for it.
//
//   - Growth: when demand exceeds the lease, it asks for the shortfall
//     rounded up to whole chunks (capped at the budget) and takes what is
//     free. A refused ask is repeated only after Retry.
//   - Return: when at least one whole chunk has stayed idle (lease − demand)
//     for Hysteresis, it lowers the capacity to what it keeps first, reads
//     what the pool holds after that, and gives back only the rest.
//   - Renewal: every TTL/3. A lease is trusted until TTL − TTL/3 after the
//     call that last renewed it was sent (before Redis stamped its expiry),
//     which leaves a third of the TTL for late timers and callbacks. That
//     horizon goes to the pool with the capacity (OnTrust), which checks it
//     where it admits: a replica paused past it admits nothing new on the
//     lease, even before this lessee runs again, until a call confirms it.
//
// Capacity, when the store answers: the lease, scaled by budget / total
// when the fleet's leases exceed a lowered budget, and never above the
// replica's own budget. So Σ capacity ≤ Σ leases ≤ budget.
//
// # Residual holds
//
// A replica that stops calling Redis (paused by SIGSTOP or a stalled VM,
// cut off from Redis, or killed) looks the same to the others in every
// case, but only a killed one's requests end with it: a paused or cut-off
// replica's requests keep running on the backend, which does not know, and
// keep their KV blocks. So its lease is not freed at its TTL. The rule: a
// lease counts until what was admitted on it must have ended. Past its TTL
// it is no longer live (its holder trusts it no more, and admits nothing
// new on it, from TTL − TTL/3 after its last call was sent: "Renewal"
// above), but it stays counted as the replica's residual hold: nobody may
// lease it, and the fair levels are computed over the budget less the
// residual holds. It ends when the replica calls again — any call revives
// it as the lease it was, so a replica back from a pause carries on with
// its requests covered and nothing lost — or when the residual bound
// (LesseeConfig.Residual: shared_budget.residual_ttl, by default lease_ttl
// + the request timeout) has passed since its last call: its last
// admission came before its TTL ended, and a request ends within the
// request timeout of arriving. The bound is stamped by Redis at each call,
// like the expiry, so a silent replica needs no one to clean up after it.
//
// What counts is the lease, not what the replica's pool held when it last
// called: the pool admits inside its capacity without a round trip, so
// what it held at its last call understates what it may hold when it falls
// silent (a burst admitted on a fresh grant, then a pause). The lease is
// what it may hold. That costs little: under saturation a pool holds about
// its lease, and an idle one gives its chunks back after the hysteresis,
// so a replica idle before it fell silent leaves nothing behind. A replica
// stopped cleanly (Close, after its drain) gives back what its pool does
// not hold, all of it when the drain ended every request, and frees its
// part at once. From Redis a kill and a pause look alike, but not from the
// backend: a killed replica's requests died with its connections. So every
// call also publishes what this replica's requests may hold now
// (Request.Holds, the guard's bound), and a live replica that reads its
// backends' reported use covered by its own bound plus the other live
// replicas' published holds, within the reconciliation's tolerance, for
// EvidenceReports reports in a row (Evidence, Replica.Observe), ends the
// residual holds at once (Store.DropResidual; a hold revived meanwhile is
// live and stays). A paused or cut-off replica's requests still show on the
// backend, and its hold stays up to the bound. What evidence cannot see is
// a silent replica holding less than the tolerance that admits more later
// (cut off, on its fallback); that memory then shows to the reconciliation
// as unaccounted and comes off the budget. Config.ResidualRelease "timer"
// leaves the bound alone; residual_ttl equal to lease_ttl frees every
// silent replica's lease at the TTL, safe only where requests always end
// with their replica.
//
// # Chunk size: waste against round trips
//
// After growth the lease exceeds demand by less than a chunk, and a whole
// idle chunk goes back after the hysteresis, so a replica leaves less than
// one chunk unused (per GPU): up to replicas × chunk of the budget is leased
// but idle, which other replicas cannot admit into. Each change of demand
// by a chunk costs one round trip (one grant or one return); smaller
// changes cost none. A chunk of 1–5 % of the budget wastes at most that
// much per replica and keeps Redis traffic at a few calls per second per
// replica even under churn; renewals add 3 per TTL. Grants are partial (the
// last free bytes are granted even if less than a chunk), so the whole
// budget is leasable whatever the chunk.
//
// # Failures
//
//   - A replica dies (kill -9), is paused, or is cut off from Redis: it
//     stops renewing; its announcement expires after the TTL, its lease
//     becomes a residual hold (above) and the others may lease that part
//     once the residual bound has passed, or at once when it gives the
//     lease back.
//   - Redis unreachable: a replica keeps its lease as capacity while it
//     can trust it (above), retrying every Retry. Then it falls back to
//     min(capacity, budget/Replicas): never more than it was granted, never
//     more than its static share. Since Σ leases ≤ budget, the fleet stays
//     within the budget. With FallbackGrace g, once TTL + g have passed since
//     its first failure — by when every replica is in fallback and weight
//     admitted above a share has finished — it may use its whole share.
//     Without it, a replica that held little when Redis went away serves
//     little until it returns.
//   - Redis returns (possibly empty, after a restart without persistence):
//     the replica's first answer ends the fallback. It leases what its pool
//     holds before anything else (all or nothing) and does not grow for one
//     TTL, by when every live replica — each retrying every Retry ≤ TTL/3 —
//     has leased what it holds. Only then do leases grow by demand again.
//   - A lease lost while the replica was not failing (the store answers
//     with less than the replica counted: Redis restarted within a TTL, or
//     the replica stalled past its residual bound) is handled the same way, and
//     counted in Stats.LostLeases.
//
// What this cannot prevent: a replica cut off from Redis while the others
// still reach it looks dead to them. Its residual hold covers its fallback
// capacity (never more than its lease) until the residual bound; if the
// cut outlasts it while the replica serves — and, with FallbackGrace, grows
// to its whole share — the fleet may exceed the budget by that replica's
// fallback capacity until the cut heals. Telling a
// cut-off replica from a dead one needs consensus, which this design leaves
// to Redis; an operator who cannot accept the risk runs Redis beside the
// replicas (or with Sentinel) so that cuts are rare.
//
// # Locking
//
// Memory: one mutex over all its books. Redis: none in Go; Redis runs the
// script alone. Lessee: Step runs on one goroutine at a time (Run's) and
// owns the state; Stats are a snapshot under statsMu, published before the
// pool hears of a capacity change; SetBudget and Wake are atomics and a
// channel send. Replica: see its type.
//
// What the package does not do: decide budgets (the gateway derives them
// and passes them in), admit requests (package admission does), or export
// metrics (Leases, Stats and Deps.Observe give the gateway what it needs).
package sharedbudget
