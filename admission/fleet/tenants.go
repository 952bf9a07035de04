package fleet

import "encoding/json"

// Tenants' shares across the fleet. A tenant's share caps what it holds on
// a GPU; each replica enforces it on what it admitted, so a tenant spread
// over k replicas could hold k shares. So each replica also posts, per
// GPU, what each capped tenant holds there (Scheduler.TenantHolds), and
// counts what the others posted against those tenants' shares
// (Scheduler.SetTenantsElsewhere), every fair-share step, in the same
// round trip as its demand (fairScript). A replica that falls silent
// leaves the board with its TTL. While the board cannot be read, the last
// figures stay: a tenant keeps within what it was allowed.
//
// The others' figures are one fair-share step old, and each replica admits
// up to the share less them: replicas that find room for a tenant in the
// same step each fill all of it, so the tenant can hold more than its share
// until the next step shows them over (never more than the replicas' count
// times it, since each one's own holds are exact). A bound would split the
// room the board shows among the replicas by the tenant's demand on each,
// as the fair levels split the budget.

// tenantPost is what pl's capped tenants hold on its GPU, as posted:
// fairScript carries it on the same round trip as the demand.
func (f *Fleet) tenantPost(pl *poolLease) string {
	own, err := json.Marshal(f.sched.TenantHolds(pl.pool))
	if err != nil {
		return "{}" // a map of strings to ints always encodes
	}
	return string(own)
}

// sumTenants adds up the others' posts; an unreadable one counts for
// nothing.
func sumTenants(posts []string) map[string]int64 {
	sum := map[string]int64{}
	for _, p := range posts {
		var m map[string]int64
		if json.Unmarshal([]byte(p), &m) != nil {
			continue
		}
		for tenant, n := range m {
			if n > 0 {
				sum[tenant] += n
			}
		}
	}
	return sum
}
