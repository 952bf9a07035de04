package fleet

import (
	"context"
	"encoding/json"

	"github.com/redis/go-redis/v9"
)

// Tenants' shares across the fleet. A tenant's share caps what it holds on
// a GPU; each replica enforces it on what it admitted, so a tenant spread
// over k replicas could hold k shares. So each replica also posts, per
// GPU, what each capped tenant holds there (Scheduler.TenantHolds), and
// counts what the others posted against those tenants' shares
// (Scheduler.SetTenantsElsewhere), every fair-share step. A replica that
// falls silent leaves the board with its TTL. While the board cannot be
// read, the last figures stay: a tenant keeps within what it was allowed.

// tenantScript posts one replica's tenants' holds on a GPU's tenant board
// and returns the others' live posts. Time is Redis's own.
//
// KEYS[1] hash replica -> "expiry_ms json"; ARGV: replica, json, ttl ms.
var tenantScript = redis.NewScript(boardPrelude + `
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now + ttl) .. ' ' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local e, v = string.match(all[i + 1], '^(%d+) (.*)$')
  if e == nil or tonumber(e) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  elseif all[i] ~= ARGV[1] then
    table.insert(out, v)
  end
end
return out
`)

// shareTenants posts pl's tenants' holds and sets what the other replicas
// hold for each tenant on its GPU.
func (f *Fleet) shareTenants(ctx context.Context, pl *poolLease) {
	own, err := json.Marshal(f.sched.TenantHolds(pl.pool))
	if err != nil {
		return // a map of strings to ints always encodes
	}
	cctx, cancel := context.WithTimeout(ctx, f.cfg.LeaseTTL.D/3)
	start := f.clock.Now()
	v, err := tenantScript.Run(cctx, f.client, []string{f.cfg.KeyPrefix + "{" + pl.gpu + "}:tenants"},
		f.cfg.Replica, string(own), f.cfg.LeaseTTL.D.Milliseconds()).StringSlice()
	cancel()
	f.observe("tenants", f.clock.Now().Sub(start), err)
	if err != nil {
		return
	}
	_ = f.sched.SetTenantsElsewhere(pl.pool, sumTenants(v)) // a pool a reload removed has none to set
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
