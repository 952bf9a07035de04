package sharedbudget

import (
	"encoding/json"

	"github.com/kvgate/kvgate/admission"
)

// Tenants' shares across the fleet. A tenant's share caps what it holds on
// a GPU; each replica enforces it on what it admitted, so a tenant spread
// over k replicas could hold k shares. So each replica also posts, per
// GPU, what each capped tenant holds and wants there
// (Scheduler.TenantHolds), and hands the sum of the others' posts to its
// scheduler (Scheduler.SetTenantsElsewhere), every fair-share step, in the
// same round trip as its demand (fairScript). Their holds count against
// the tenant's share; their demand sets this replica's part of it, so that
// replicas finding room in the same step, each reading the others a step
// late, take their parts of it rather than all of it each (admission's
// tenant.go). A replica that falls silent leaves the board with its TTL.
// While the board cannot be read, the last figures stay: a tenant keeps
// within what it was allowed.

// tenantPost is what pl's capped tenants hold and want on its GPU, as
// posted: a JSON object of tenant -> [held, demand]. fairScript carries it
// on the same round trip as the demand.
func (f *Replica) tenantPost(pl *poolLease) string {
	loads := f.sched.TenantHolds(pl.pool)
	post := make(map[string][2]int64, len(loads))
	for name, l := range loads {
		post[name] = [2]int64{l.Held, l.Demand}
	}
	own, err := json.Marshal(post)
	if err != nil {
		return "{}" // a map of strings to pairs of ints always encodes
	}
	return string(own)
}

// sumTenants adds up the others' posts; an unreadable entry counts for
// nothing. A bare number is a post of a replica that sends its holds
// alone: its demand is taken as its holds.
func sumTenants(posts []string) map[string]admission.TenantLoad {
	sum := map[string]admission.TenantLoad{}
	for _, p := range posts {
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(p), &m) != nil {
			continue
		}
		for tenant, raw := range m {
			var l admission.TenantLoad
			var pair [2]int64
			if json.Unmarshal(raw, &pair) == nil {
				l = admission.TenantLoad{Held: pair[0], Demand: pair[1]}
			} else if json.Unmarshal(raw, &l.Held) == nil {
				l.Demand = l.Held
			}
			if l.Held < 0 || l.Demand <= 0 {
				continue
			}
			s := sum[tenant]
			s.Held += l.Held
			s.Demand += max(l.Demand, l.Held)
			sum[tenant] = s
		}
	}
	return sum
}
