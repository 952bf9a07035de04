package sharedbudget

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Store keeps, per budget key (one GPU's budget), one lease per replica and
// the budget each replica announces. It is what a Lessee talks to; the
// gateway also reads Leases for its fleet view. Memory and Redis implement
// it and pass the same contract tests.
//
// Every call from a replica proves it alive: it renews that replica's lease
// and its budget announcement for r.TTL. Counting (see doc.go): a lease is
// live until its TTL passes unrenewed, and then counts on as the replica's
// residual hold until r.Residual has passed since its last call (the
// replica's next call revives it); the key's budget is the smallest live
// announcement (0 when there is none); Acquire grants only while the leases
// and residual holds plus the grant fit that budget.
type Store interface {
	// Acquire grows r.Replica's lease on key by as much of bytes as is free,
	// if at least least bytes are (least 0 means bytes: all or nothing). A refusal is
	// not an error: it returns Granted 0.
	Acquire(ctx context.Context, key string, r Request, bytes, least int64) (Lease, error)
	// Renew extends r.Replica's lease (if it still has one) and its
	// announcement by r.TTL. Held 0 in the answer means the lease is gone.
	Renew(ctx context.Context, key string, r Request) (Lease, error)
	// Release returns bytes of r.Replica's lease (all of it if it holds
	// less) and renews the rest.
	Release(ctx context.Context, key string, r Request, bytes int64) (Lease, error)
	// DropResidual ends, as r.Replica's call (which renews its own lease),
	// every other lease on key past its holder's trust horizon: residual
	// holds (past their TTL), and live leases within a third of their TTL
	// of their expiry, on which their holder admits nothing new. The caller
	// has seen evidence that the silent replicas' requests are gone (see
	// doc.go, "Residual holds"). A lease renewed by its replica before this
	// call stays. Dropped in the answer is what went.
	DropResidual(ctx context.Context, key string, r Request) (Lease, error)
	// Leases lists every replica that holds a lease (live or residual) or
	// has a live announcement on key: the fleet view. Leases past their
	// residual bound are not listed.
	Leases(ctx context.Context, key string) (Listing, error)
}

// Request says who is asking and what it believes.
type Request struct {
	// Replica names the lease holder: unique per gateway process and stable
	// for its lifetime. Required.
	Replica string
	// Budget is the key's budget as this replica derives it now, in bytes;
	// the store uses the smallest live announcement. 0 announces nothing (a
	// replica that does not know its budget yet defers to the others).
	Budget int64
	// TTL is how long the lease and the announcement live without another
	// call; at least a millisecond (the Redis store's resolution).
	TTL time.Duration
	// Residual is how long after this call the lease still counts if the
	// replica makes no other: past its TTL it is the replica's residual
	// hold, which no other replica may lease, because requests the replica
	// admitted on it may still run on the GPU (a paused or cut-off replica
	// looks dead to the store, but its requests do not stop). 0, or less
	// than TTL: TTL (the lease ends with its TTL).
	Residual time.Duration
	// Holds is what the requests this replica admitted on the GPU may hold
	// there now, a bound that cannot be below the truth; published with the
	// lease so that the others can tell, from the backend's figures, whether
	// a silent replica's requests still run (see doc.go). 0: none.
	Holds int64
	// Running is how many requests Holds is of.
	Running int64
}

// Lease is a replica's standing after a call, as the store saw it.
type Lease struct {
	Granted  int64 // bytes this Acquire added (0: refused)
	Released int64 // bytes this Release gave back
	Held     int64 // the replica's lease after the call
	// TTL is what is left of the lease (0 when Held is 0), by the store's
	// clock.
	TTL    time.Duration
	Total  int64 // all leases on the key, this one and residual holds included
	Budget int64 // the key's budget: the smallest live announcement
	// Residual is the part of Total that other replicas hold as residual
	// holds: leases past their TTL that still count.
	Residual int64
	// LiveHolds is what the other fresh replicas (those whose last call is
	// within half their TTL: they renew every third) published that their
	// requests may hold (Request.Holds), at their last calls.
	LiveHolds int64
	// LiveRunning is how many requests LiveHolds is of (Request.Running).
	LiveRunning int64
	// Silent is the other replicas' leases that are not fresh: residual
	// holds, and live leases whose holder missed a renewal.
	Silent int64
	// Dropped is what a DropResidual ended.
	Dropped int64
}

// Listing is the key's state: its budget, its live leases, and who holds them.
type Listing struct {
	Budget   int64
	Total    int64    // leases, residual holds included
	Residual int64    // the residual holds' part of Total
	Holders  []Holder // sorted by Replica
}

// Holder is one replica's part of a Listing.
type Holder struct {
	Replica string
	Bytes   int64         // its lease; 0 if it only announces a budget
	TTL     time.Duration // left on its lease; 0 if it holds none or its lease is a residual hold
	Budget  int64         // its live announcement; 0 if none
	// Residual: its lease's TTL has passed unrenewed, and the lease counts
	// on, for Keep more, as what its requests may still hold.
	Residual bool
	Keep     time.Duration // left until its lease stops counting; 0 if it holds none
	Holds    int64         // what it published its requests may hold, at its last call
}

// MaxBytes bounds every byte count a Store accepts: 2^53, the largest
// integer that Redis's Lua numbers (doubles) hold exactly. 8 PiB is far
// beyond any KV budget.
const MaxBytes = 1 << 53

var (
	// ErrInvalid: a call whose arguments can never succeed (empty key or
	// replica, a non-positive size or TTL, a size past MaxBytes).
	ErrInvalid = errors.New("invalid lease request")
	// ErrUnavailable: the store could not be reached or did not answer; the
	// call may or may not have taken effect. The underlying error is wrapped
	// too.
	ErrUnavailable = errors.New("lease store unavailable")
)

// opError names the operation, key and replica in front of the cause, so
// that every error says which budget it concerns.
func opError(op, key, replica string, cause error) error {
	if replica == "" {
		return fmt.Errorf("leases: %s on %q: %w", op, key, cause)
	}
	return fmt.Errorf("leases: %s on %q for replica %q: %w", op, key, replica, cause)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// check validates what every call of a replica shares.
func check(key string, r Request) error {
	switch {
	case key == "":
		return invalid("empty key")
	case r.Replica == "":
		return invalid("empty replica")
	case r.TTL < time.Millisecond:
		return invalid("ttl %v below 1ms", r.TTL)
	case r.Budget < 0 || r.Budget > MaxBytes:
		return invalid("budget %d outside [0, %d]", r.Budget, int64(MaxBytes))
	case r.Residual < 0:
		return invalid("residual %v is negative", r.Residual)
	case r.Holds < 0 || r.Holds > MaxBytes || r.Running < 0 || r.Running > MaxBytes:
		return invalid("holds %d of %d requests outside [0, %d]", r.Holds, r.Running, int64(MaxBytes))
	}
	return nil
}

func checkSize(bytes int64) error {
	if bytes < 1 || bytes > MaxBytes {
		return invalid("size %d outside [1, %d]", bytes, int64(MaxBytes))
	}
	return nil
}

// checkAcquire validates an Acquire and resolves its least (0 means bytes:
// all or nothing).
func checkAcquire(key string, r Request, bytes, least int64) (int64, error) {
	if err := check(key, r); err != nil {
		return 0, err
	}
	if err := checkSize(bytes); err != nil {
		return 0, err
	}
	if least == 0 {
		return bytes, nil
	}
	if least < 0 || least > bytes {
		return 0, invalid("least %d outside [0, %d]", least, bytes)
	}
	return least, nil
}

func checkRelease(key string, r Request, bytes int64) error {
	if err := check(key, r); err != nil {
		return err
	}
	return checkSize(bytes)
}

func sortHolders(h []Holder) {
	slices.SortFunc(h, func(a, b Holder) int { return strings.Compare(a.Replica, b.Replica) })
}
