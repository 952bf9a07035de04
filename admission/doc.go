// Package admission decides which requests may run now on a memory budget:
// a memory-weighted semaphore with priority classes, per-tenant quotas, a
// bounded queue, early shedding from a measured drain rate, and a closed
// loop that shrinks the capacity while a backend reports it is over its
// ceiling. It knows weights (predicted KV bytes), not models or HTTP: the
// caller turns a request into a weight (package kvbudget) and a refusal
// into a status code.
//
// # Model
//
// A Budget has a nominal capacity C (Config.Capacity, or Resize) and an
// effective capacity E <= C that the AIMD loop moves (Feedback: E × Decrease
// on an over-ceiling report, never below MinFraction × C; + Increase × C on
// an under-ceiling one, never above C). Acquire asks for weight w in a class
// for a tenant; a Ticket holds it until Release. Each tenant t may hold at
// most its cap, floor(share_t × C).
//
// # Invariants
//
//   - The held weight never exceeds E at the moment of any admission.
//     Shrinking E or C revokes nothing: held may then exceed E, and nothing
//     is admitted until it is back under.
//   - Every admitted weight is given back exactly once: Release is
//     idempotent, Shrink gives back part, and a failed or cancelled Acquire
//     leaves nothing held — including when the grant and the cancellation
//     happen at the same moment (the grant is undone).
//   - A request that can never fit (w > C, or w > its tenant's cap) is
//     refused at once and never waits, so it never blocks anyone.
//   - Every refusal is a *RejectError matching exactly one sentinel; every
//     exit from Acquire is counted once (Stats) and reported once to the
//     Observer, outside the lock.
//
// # Fairness policy
//
// Waiters are served by class, highest first, and first come first served
// within a class. Like x/sync's semaphore, a waiter that does not fit in the
// free capacity blocks everyone behind it, in its class and in all lower
// classes, so a large request is not starved by a stream of small ones. The
// one exception is a waiter over its own tenant's cap: it cannot be admitted
// whatever the others do, so it is skipped — and so are its tenant's later
// waiters, so that a tenant's own requests stay in order — and it blocks
// nobody else. One tenant flooding long prompts therefore fills its own
// share and its own share of the queue, and another tenant's short requests
// keep flowing through the rest. A new request goes straight in only if it
// fits and nobody it must not overtake is waiting: a blocker in its class or
// a higher one, or a waiter of its own tenant in its class or a higher one.
// A higher class overtakes a lower one without limit: priority is strict.
//
// # Queue bounds and deadlines
//
// Each class bounds its waiters in count (MaxQueued) and bytes
// (MaxQueuedBytes); each tenant may use QueueShare of both, rounded up.
// Beyond them a request gets ErrQueueFull. A waiter's deadline is the
// earlier of Request.Deadline and now + the class's QueueTimeout; when it
// passes the waiter is removed with ErrQueueTimeout. A cancelled context
// removes the waiter at once (an error wrapping ctx.Err()), and if it was the
// head of the queue the ones behind it are admitted if they fit.
// A sheddable class is refused with ErrOverloaded while held/E exceeds
// PressureThreshold (checked on arrival only; a queued sheddable request is
// not evicted later).
//
// # Drain rate, early shedding and Retry-After
//
// The drain rate r is the weight given back by tickets (Release and Shrink)
// over the last DrainWindow, kept in 10 buckets of DrainWindow/10: r =
// total / span, where span runs from the start of the oldest bucket in the
// window (or from the budget's creation, if later) to now, and is at least
// one bucket. To keep the clock off Release, releases are time-stamped
// lazily: a run of releases between two readings of the rate is spread
// evenly from its first release to the reading. A request of weight w, with
// A weight queued ahead of it (its
// class and the higher ones) and A_t of it its own tenant's, lacks
//
//	need = max(A + w − (E − held), held_t + A_t + w − cap_t)
//
// and its expected wait is need / r. If that exceeds the time left before
// its deadline it is refused at once with ErrQueueTimeout instead of
// queueing. With no release in the window there is no measurement (a cold
// start) and nothing is shed early. The estimate is optimistic on purpose
// (it takes the whole drain rate for the request and its tenant): shedding
// early is only right when even the optimistic wait is too long.
//
// Every refusal that a retry can cure carries RetryAfter = the expected
// wait clamped to [1s, MaxRetryAfter], or DrainWindow (clamped the same way)
// when there is no measurement. For ErrOverloaded need = held − floor(
// PressureThreshold × E); for a timeout while queued, A is what was still
// ahead of the waiter. ErrTooLarge and ErrTenantQuota carry 0: retrying
// never helps.
//
// # Locking
//
// One mutex, Budget.mu, guards all of a budget's state: capacities, held
// weights, queues, tenants, the drain estimator, and every Ticket's weight
// (Ticket.Weight takes it too, so the fast path needs no atomics). Methods
// named ...Locked run with it held. The only calls made under it to other
// code are Clock.AfterFunc and Timer.Stop; timer functions run in their own
// goroutines. Exit counters are atomics, updated by the goroutine that
// returns from Acquire, which also calls the Observer after unlocking.
//
// Costs: an admission that fits at once takes the lock once, reads no clock
// and allocates 1/32 of a slab of Tickets (AcquireTicket, into a Ticket the
// caller owns, allocates nothing); Release takes the lock once and reads the
// clock only for the first release after the rate was last read. Every
// Release, Shrink, Resize, Feedback or cancellation that may let a waiter in
// runs one dispatch pass, which walks the queue up to the first blocker:
// O(skipped waiters), bounded by the queue bounds. Queueing allocates the
// waiter, its channel and its deadline timer.
//
// What the package does not do: it does not predict weights, pick a
// backend, measure KV usage itself, or share a budget across processes.
package admission
