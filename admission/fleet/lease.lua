-- The one place where leases change (see doc.go). Atomic: Redis runs a script
-- alone, so purge, count and grant see one consistent state.
--
-- Invariant kept here: after any call, the live leases of the key sum to at
-- most the smallest live announced budget, except where that budget was
-- lowered under leases already granted (nothing is revoked; nothing more is
-- granted until the sum is back under it).
--
-- KEYS[1] leases       hash  replica -> bytes leased
-- KEYS[2] lease expiry zset  replica -> expiry, ms of Redis TIME
-- KEYS[3] budgets      hash  replica -> bytes announced
-- KEYS[4] budget expiry zset replica -> expiry, ms
-- KEYS[5] ops          hash  replica -> "<op id> <bytes moved>", so that a
--                      client's retry of the same call is answered, not redone
-- ARGV: op (acquire|renew|release|list), replica, bytes, least, budget, ttl ms,
--       op id (may be empty)
--
-- Every number handed back to Redis goes through fmt: Lua's own number to
-- string conversion may print large integers as 1e+15.
local leases, lexp, budgets, bexp, ops = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local op, replica = ARGV[1], ARGV[2]
local bytes, least, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local opid = ARGV[7]

local function fmt(n) return string.format('%.0f', n) end

-- Time comes from Redis, never from a replica: replicas' clocks may differ.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Expired entries go first (no cron): an entry expiring at or before now is
-- dead.
local function purge(hash, zset)
  local dead = redis.call('ZRANGEBYSCORE', zset, '-inf', now)
  if #dead > 0 then
    for _, r in ipairs(dead) do redis.call('HDEL', hash, r) end
    redis.call('ZREMRANGEBYSCORE', zset, '-inf', now)
  end
end
purge(leases, lexp)
purge(budgets, bexp)

-- Each key expires with the last of its entries, so that an abandoned
-- budget leaves nothing behind.
local function keep(hash, zset)
  local last = redis.call('ZRANGE', zset, -1, -1, 'WITHSCORES')
  if #last == 2 then
    redis.call('PEXPIREAT', hash, last[2])
    redis.call('PEXPIREAT', zset, last[2])
  end
end

local function sum(hash)
  local s = 0
  for _, v in ipairs(redis.call('HVALS', hash)) do s = s + tonumber(v) end
  return s
end

local function smallest(hash)
  local m = 0
  for _, v in ipairs(redis.call('HVALS', hash)) do
    v = tonumber(v)
    if m == 0 or v < m then m = v end
  end
  return m
end

if op == 'list' then
  -- budget, total, then per replica: name, bytes, ttl ms, announced budget.
  local out = {fmt(smallest(budgets)), fmt(sum(leases))}
  local seen = {}
  local function add(r)
    if seen[r] then return end
    seen[r] = true
    local b = redis.call('HGET', leases, r)
    local e = redis.call('ZSCORE', lexp, r)
    local a = redis.call('HGET', budgets, r)
    local left = 0
    if b and e then left = tonumber(e) - now end
    table.insert(out, r)
    table.insert(out, b or '0')
    table.insert(out, fmt(left))
    table.insert(out, a or '0')
  end
  for _, r in ipairs(redis.call('HKEYS', leases)) do add(r) end
  for _, r in ipairs(redis.call('HKEYS', budgets)) do add(r) end
  return out
end

-- A replica's call announces its budget (if it knows one) for ttl.
if ARGV[5] ~= '0' then
  redis.call('HSET', budgets, replica, ARGV[5])
  redis.call('ZADD', bexp, fmt(now + ttl), replica)
  keep(budgets, bexp)
end

local budget = smallest(budgets)
local total = sum(leases)
local held = tonumber(redis.call('HGET', leases, replica) or '0')

-- A call the client sent again (its answer was lost) is answered from the
-- record of the first run.
local moved, replay = 0, false
if opid ~= '' then
  local last = redis.call('HGET', ops, replica)
  if last then
    local sep = string.find(last, ' ', 1, true)
    if string.sub(last, 1, sep - 1) == opid then
      moved, replay = tonumber(string.sub(last, sep + 1)), true
    end
  end
end

if not replay then
  if op == 'acquire' then
    local free = budget - total
    if free >= least then
      moved = math.min(bytes, free)
    end
    held, total = held + moved, total + moved
  elseif op == 'release' then
    moved = math.min(bytes, held)
    held, total = held - moved, total - moved
  end
  if opid ~= '' then
    redis.call('HSET', ops, replica, opid .. ' ' .. fmt(moved))
    -- Long enough for any client retry, short enough to leave nothing.
    redis.call('PEXPIRE', ops, math.max(ttl, 60000))
  end
end

-- Every call renews the caller's lease, or removes it once empty.
local left = 0
if held > 0 then
  redis.call('HSET', leases, replica, fmt(held))
  redis.call('ZADD', lexp, fmt(now + ttl), replica)
  left = ttl
else
  redis.call('HDEL', leases, replica)
  redis.call('ZREM', lexp, replica)
end
keep(leases, lexp)

return {moved, held, left, total, budget}
