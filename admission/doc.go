// Package admission decides which requests may run now, and where: queues
// of waiting requests (one per model) are bound late to GPUs by a
// dispatcher, through priority classes, per-tenant quotas, bounded lines
// with deadlines, early shedding with a Retry-After clients can trust, and
// a closed loop that shrinks a GPU's budget while its backend reports it is
// over. A GPU here is one budget, as the gateway's configuration names it
// (`gpu`): one card, or one tensor-parallel group. It knows weights and steps, not models or HTTP: the caller
// describes a request as a Shape (tokens, blocks, a cap) or a plain weight,
// and turns a refusal into a status code.
//
// # Model
//
// A Scheduler has GPUs and queues. A GPU's budget has a nominal capacity C
// (Resize) and an effective capacity E <= C that the AIMD loop moves
// (Feedback: E × Decrease on an over report, never below MinFraction × C;
// + Increase × C on an under one, never above C). Memory its backends hold
// that no admitted request accounts for (SetUnaccounted, as a Reconciler
// finds it: reconcile.go) comes off E for admissions while it lasts, an
// input of its own beside the AIMD loop and a limit. A queue lists the GPUs
// that may serve it (SetAvailable turns one on or off, as its backend's
// circuit does). Acquire asks for a request in a queue, a class and for a
// tenant; it is bound to whichever of its queue's GPUs has room for it
// first, and its Ticket holds it there until Release. Several queues may
// share a GPU (several models on one GPU); a request of one queue never
// waits behind another queue's unless they compete for the same GPU.
//
// # What a request holds
//
// Under WorstCase a request holds its worst case — every sequence at its
// cap — from admission to release, minus the sequences that finish (Done):
// what is held never exceeds E at an admission, so a backend can never
// overflow.
//
// Under Predicted, each queue learns the distribution of its sequences'
// output lengths from the ones that finish (package predict: Kaplan–Meier
// over a decaying histogram, the cap-stopped ones as censored samples), per
// tenant too once a tenant has enough samples of its own. A running request
// whose sequences have generated g tokens (Progress) holds its prompt and
// those tokens now, and will grow one token a step until it stops — at a
// length drawn from the learned distribution conditioned on L > g, and at
// its cap at the latest. Summing those over a GPU's tickets gives, at each
// future step, the mean and variance of the memory held then (requests
// finish at different times, so this is the batch's future memory curve,
// not the sum of final sizes); a candidate fits while the peak over the
// future of mean + z·sd, with z the normal quantile of 1 − Epsilon, stays
// within E. This is the future-peak admission of LightLLM's Past-Future
// scheduler, with the per-request quantiles replaced by a bound on the
// probability of overflow, which many independent requests make tight. A
// stream the guard can stop and resume (a ResumableStopper that says so)
// is admitted on ResumableEpsilon instead: what its looser bound risks is a
// pause for it or another such stream, the guard's first victims, never an
// error. A
// request whose progress is not reported (Opaque: a non-streamed answer),
// one of a queue still warming up (fewer than WarmupSamples) or
// distrusted, and one without a Shape are held at their worst case; one
// that sets its own length (Pinned) is taken to run every sequence to its
// cap, growing as its progress says — certain, never a guess. While a GPU's backend reports more than (1 − Headroom) × E in
// use, nothing new is admitted to it on the forecast's word: the backend's
// own account is ground truth, and Feedback widens the margin when it is
// exceeded. A request whose worst case fits beside every worst case held
// needs no forecast and passes the gate (it is safe whatever the report
// says), except on a GPU with a limit, whose report is the whole GPU's.
//
// # When the forecast is wrong
//
// ε holds only while traffic looks like the history it was learned from;
// guard.go holds whatever the traffic does. Every ticket has a now: what
// it may hold before its next Progress (prompt, tokens and the next block,
// as the forecast's step 0), or its worst case when it reports no
// progress. When a Progress takes a GPU's sum of them past its capacity,
// running requests are stopped through their Stopper (predicted ones
// first, the lowest class, the tenant holding the most for its share, the
// newest) until what is not stopped fits; a stopped ticket counts until it
// is released. The worst cases a GPU holds sum to at most MaxOvercommit ×
// its capacity (a tenant's to that times its share). A change detector
// (drift.go) judges each sequence against the forecast it was admitted on
// and weighs its growth past it by the room the guard has left; its trip
// distrusts the tenant or class whose forecast was wrong (the queue, for
// its anonymous traffic of one class) for CoolDown: their requests, running
// ones too, go to their worst case and their own predictors start over. A
// stop that cuts a request (one that cannot be resumed) or Overflowed does
// that for the whole queue; a stop of streams that will be resumed alone is
// what their looser bound prices in, and distrusts nothing. A ticket
// released before its
// sequences finished teaches each as censored at the length it reached, and
// so does every sequence still running when a warm-up ends (the first to
// finish are the shortest); a ticket forecast only from then on takes no
// part in the change detector, having been picked by its survival.
// Opaque and Pinned requests are never forecast from learned lengths. Linger keeps a given-up
// ticket held until the backend can have let its blocks go.
//
// A request's charge is what it counts for against its tenant's cap, GPU
// reservations and the drain rate: its worst case, or under Predicted the
// peak of its own expected size.
//
// # Order
//
// Classes go by priority, strictly; within a class, requests go by arrival
// across every queue. When a request fits no GPU, the first such request
// of its queue reserves the GPU where it is expected to start first: the
// step at which enough running requests will have finished (their median
// remaining length, their cap under WorstCase) for its charge to fit, and
// the charge that will still be spare then. Requests behind it may start on
// that GPU only if they are expected to finish before that step (their
// 0.9 quantile, or cap) or fit in the spare charge, and freely on other
// GPUs: EASY backfilling, so that a long request at the head does not hold
// back short ones that fit now, and is not delayed by them. Once the head
// has waited Backfill.MaxHeadAge (or with backfilling disabled) it blocks
// instead: nobody starts on any of its GPUs and nobody of its queue passes
// it, as in x/sync's semaphore, so a large request is never starved. A
// request over its tenant's cap on every GPU is passed over — and so are
// its tenant's later requests in that queue, so that a tenant's own
// requests stay in order — and holds back nobody else. A new request goes
// straight in only if nobody waits ahead of it in its queue (its class or
// higher) and a GPU whose reservation allows it has room.
//
// Under Predicted, a waiter of a higher class that fits no GPU on the
// forecast may start preemptively once it has waited Preemption.After
// (preemption.go): on room that resumable streams of lower classes hold,
// which the guard stops if the batch then outgrows the GPU.
//
// Among the GPUs where a request may start, its Affinity picks one by
// rendezvous hashing (the same session or prompt prefix lands on the same
// GPU, where the backend's prefix cache has it) when that GPU fits; else
// the GPU with the most room left after it.
//
// # Invariants
//
//   - Under WorstCase, what a GPU holds never exceeds E at the moment of
//     an admission; under Predicted, the peak of its forecast (at the
//     bound of the request admitted: ResumableEpsilon's for a resumable
//     stream, Epsilon's for any other) never does — except at a
//     preemptive admission, where what every ticket may hold now plus the
//     newcomer's worst case never does, and the worst cases of the GPU's
//     preemptive tickets never exceed what the resumable streams of lower
//     classes hold now.
//     Shrinking E or C revokes nothing: nothing is admitted until it is
//     back under.
//   - Every admission is given back exactly once: Release is idempotent,
//     Done gives back part, Move gives back before it binds again, and a
//     failed or cancelled Acquire leaves nothing held — including when the
//     grant and the cancellation happen at the same moment.
//   - A request that can never fit (its worst case above every GPU's C, or
//     its charge above its tenant's cap everywhere) is refused at once and
//     never waits; a queue with no GPU available refuses its waiters at
//     once (ErrNoRoute), not at their deadline.
//   - Every refusal is a *RejectError matching exactly one sentinel; every
//     exit from Acquire is counted once (Stats) and reported once to the
//     Observer, outside the lock.
//
// # Queue bounds, deadlines, shedding and Retry-After
//
// Each class line of a queue bounds its waiters in count and bytes; each
// tenant may use QueueShare of both. Beyond them a request gets ErrQueueFull.
// A waiter's deadline is the earlier of Request.Deadline and now + the
// class's QueueTimeout; when it passes the waiter is refused with
// ErrQueueTimeout. A cancelled context removes the waiter at once. A
// sheddable class is refused with ErrOverloaded while every GPU of its
// queue is committed above PressureThreshold × E.
//
// Each GPU measures the charge it gives back per second of busy time (time
// it held something) over the last DrainWindow: idle time is not a slow
// drain. A request's expected wait is what it and those ahead of it lack of
// the room left in its GPUs (or of its tenant's caps), at their summed
// rate; if it exceeds the time left before the deadline, it is refused at
// once with ErrQueueTimeout. Until the GPUs have seen minDrainReleases
// releases in the window nothing is shed early: a cold start is no
// evidence of a long wait.
//
// A refusal that a retry can cure carries a RetryAfter the official clients
// honour to the millisecond: the expected wait for it and for the refusals
// already told to come back before it, jittered by ±10% so that a refused
// burst comes back spread out, within [MinRetryAfter, min(MaxRetryAfter,
// the class's timeout)]; one to two seconds when nothing is measured yet.
// ErrTooLarge, ErrTenantQuota and ErrNoRoute carry 0.
//
// # Locking
//
// One mutex, Scheduler.mu, guards all state: GPUs, queues, tenants,
// tickets, forecasts, predictors, drain estimators. Methods named ...Locked
// run with it held. The only calls made under it to other code are
// Clock.AfterFunc and Timer.Stop; timer functions run in their own
// goroutines. Progress takes it only when a sequence enters a new block.
// Every Release, Done, Progress, Resize, Feedback, SetUsage, SetAvailable
// or cancellation that may let a waiter in runs one dispatch pass, which
// walks the waiters in order up to maxBackfillScan past the first that does
// not fit, at a cost of one forecast per candidate GPU each.
//
// # Sharing a GPU with other processes
//
// Several gateway replicas in front of one GPU each run a scheduler. An
// external limiter (package admission/sharedbudget) leases each replica's part of
// the GPU's budget and sets it as the GPU's limit (SetLimit): admissions
// are measured against min(E, limit), and a lower limit revokes nothing,
// like a shrink. It reads what to lease from Demand (what the GPU has
// committed, and the charge waiting for it) and is hurried by OnDemand when
// a request queues for lack of room or weight is given back. With
// Config.Limited every GPU starts at limit 0, so that nothing is admitted
// before the replica's part is known. The replicas' learned lengths are
// exchanged as deltas (LengthsDelta, MergeLengths), so that each predicts
// from the whole fleet's traffic. See limit.go and lengths.go.
//
// What the package does not do: measure KV usage itself (SetUsage), talk to
// backends, or talk to other processes (the caller carries limits and
// deltas).
package admission
