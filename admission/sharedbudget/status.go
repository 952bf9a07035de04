package sharedbudget

import (
	"context"
	"slices"
	"strings"
	"time"
)

// fleetListTimeout bounds the Redis round trip that refreshes /status's
// fleet view; /status itself never waits for it.
const fleetListTimeout = 500 * time.Millisecond

// fleetList is a GPU's fleet as Redis last listed it, for /status.
type fleetList struct {
	fl  Listing
	at  time.Time // when fl was read; zero: never
	err error     // the last refresh's failure, nil once one succeeds
}

// listed is pl's last fleet list, and starts reading a new one when it is
// older than a third of the lease TTL and no read is under way. /status
// answers from what is known at once: an operator looking at a Redis outage
// must not wait on it, and a page polled often must not queue reads behind
// a Redis that does not answer. nil before the first read ends.
func (f *Replica) listed(pl *poolLease) *fleetList {
	v := pl.list.Load()
	stale := v == nil || f.clock.Now().Sub(v.at) >= f.cfg.LeaseTTL.D/3
	if stale && pl.listing.CompareAndSwap(false, true) {
		go func() {
			defer pl.listing.Store(false)
			ctx, cancel := context.WithTimeout(f.bg, fleetListTimeout)
			fl, err := f.holders(ctx, pl.gpu)
			cancel()
			next := &fleetList{fl: fl, at: f.clock.Now()}
			if err != nil {
				next = &fleetList{err: err}
				if prev := pl.list.Load(); prev != nil {
					next.fl, next.at = prev.fl, prev.at
				}
			}
			pl.list.Store(next)
		}()
	}
	return v
}

// Status is the gateway's /status shared_budget: who this replica is and,
// per GPU, its lease and the fleet's, as Redis lists it.
type Status struct {
	Replica  string `json:"replica"`
	Replicas int    `json:"replicas"`
	Redis    string `json:"redis"` // without credentials
	LeaseTTL string `json:"lease_ttl"`
	// ResidualTTL is how long a silent replica's lease still counts.
	ResidualTTL string      `json:"residual_ttl"`
	Chunk       string      `json:"chunk"`
	GPUs        []LeaseView `json:"gpus"`
}

// LeaseView is one GPU's part of Status.
type LeaseView struct {
	GPU string `json:"gpu"`
	// Capacity is what this replica may commit on the GPU now: its lease,
	// or its static share (Share) in a fallback.
	Capacity    int64 `json:"capacity_bytes"`
	Leased      int64 `json:"leased_bytes"`
	FleetLeased int64 `json:"fleet_leased_bytes"`
	// Residual is the part of FleetLeased that silent replicas hold: their
	// leases' TTL passed unrenewed, and they count on until residual_ttl,
	// as what their requests may still hold on the GPU.
	Residual int64 `json:"residual_bytes"`
	Budget   int64 `json:"budget_bytes"`
	Share    int64 `json:"static_share_bytes"`
	// FairShare is the max-min fair level of the budget over the live
	// replicas' demands, which this replica admits no more than; absent
	// while the demands fit the budget.
	FairShare *int64 `json:"fair_share_bytes,omitempty"`
	// Fallback: Redis is unreachable and the replica admits on its static
	// share. Rejoining: back from a fallback or a lost lease, re-leasing
	// what it holds before it grows.
	Fallback   bool   `json:"fallback"`
	Rejoining  bool   `json:"rejoining"`
	Grants     uint64 `json:"grants"`
	Denials    uint64 `json:"denials"`
	Releases   uint64 `json:"releases"`
	Renewals   uint64 `json:"renewals"`
	Errors     uint64 `json:"errors"`
	LostLeases uint64 `json:"lost_leases"`
	LastError  string `json:"last_error,omitempty"`
	// Fleet is every live replica's lease on the GPU as Redis last listed
	// it, at FleetAsOf (RFC 3339; absent before the first list); the page
	// never waits for Redis, and FleetError says why the last refresh
	// failed.
	Fleet      []HolderView `json:"fleet"`
	FleetAsOf  string       `json:"fleet_as_of,omitempty"`
	FleetError string       `json:"fleet_error,omitempty"`
}

// HolderView is one replica's lease on a GPU in LeaseView.Fleet.
type HolderView struct {
	Replica string `json:"replica"`
	Self    bool   `json:"self,omitempty"`
	Bytes   int64  `json:"leased_bytes"`
	TTLMs   int64  `json:"ttl_ms"`
	Budget  int64  `json:"announced_budget_bytes"`
	// Residual: the replica has not renewed its lease within the TTL; the
	// lease counts on for KeepMs more, or until the replica calls again.
	Residual bool  `json:"residual,omitempty"`
	KeepMs   int64 `json:"keep_ms"`
}

// Status is /status's shared_budget. It never waits for Redis: the fleet
// of each GPU is as last listed (see listed).
func (f *Replica) Status() *Status {
	sb := f.cfg
	v := &Status{Replica: sb.Replica, Replicas: sb.Replicas, Redis: redactURL(sb.Redis),
		LeaseTTL: sb.LeaseTTL.D.String(), ResidualTTL: f.residual.String(), Chunk: sb.Chunk.String(), GPUs: []LeaseView{}}
	for _, ls := range f.Leases() {
		st := ls.Stats
		lv := LeaseView{GPU: ls.GPU, Capacity: st.Capacity, Leased: st.Leased, FleetLeased: st.FleetLeased, Residual: st.Residual, Budget: st.Budget,
			Share: st.Share, Fallback: st.Fallback, Rejoining: st.Rejoining, Grants: st.Grants, Denials: st.Denials,
			Releases: st.Releases, Renewals: st.Renewals, Errors: st.Failures, LostLeases: st.LostLeases, Fleet: []HolderView{}}
		if ls.Level >= 0 {
			level := ls.Level
			lv.FairShare = &level
		}
		if st.LastError != nil {
			lv.LastError = st.LastError.Error()
		}
		switch fl := f.listed(ls.pl); {
		case fl == nil:
			lv.FleetError = "not listed yet"
		default:
			if fl.err != nil {
				lv.FleetError = fl.err.Error()
			}
			if !fl.at.IsZero() {
				lv.FleetAsOf = fl.at.UTC().Format(time.RFC3339Nano)
			}
			for _, h := range fl.fl.Holders {
				lv.Fleet = append(lv.Fleet, HolderView{Replica: h.Replica, Self: h.Replica == sb.Replica, Bytes: h.Bytes,
					TTLMs: h.TTL.Milliseconds(), Budget: h.Budget, Residual: h.Residual, KeepMs: h.Keep.Milliseconds()})
			}
		}
		v.GPUs = append(v.GPUs, lv)
	}
	slices.SortFunc(v.GPUs, func(a, b LeaseView) int { return strings.Compare(a.GPU, b.GPU) })
	return v
}
