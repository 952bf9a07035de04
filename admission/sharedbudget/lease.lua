-- The one place where leases change (see doc.go). Atomic: Redis runs a script
-- alone, so purge, count and grant see one consistent state.
--
-- Invariant kept here: after any call, the leases of the key — live ones and
-- residual holds — sum to at most the smallest live announced budget, except
-- where that budget was lowered under leases already granted (nothing is
-- revoked; nothing more is granted until the sum is back under it).
--
-- KEYS[1] leases       hash  replica -> bytes leased
-- KEYS[2] lease expiry zset  replica -> expiry, ms of Redis TIME
-- KEYS[3] budgets      hash  replica -> bytes announced
-- KEYS[4] budget expiry zset replica -> expiry, ms
-- KEYS[5] ops          hash  replica -> "<op id> <bytes moved>", so that a
--                      client's retry of the same call is answered, not redone
-- KEYS[6] lease keep   zset  replica -> when its lease stops counting, ms
-- KEYS[7] holds        hash  replica -> "<bytes>:<ttl ms>:<requests>": what its
--                      requests may hold now, as it last published (a bound),
--                      its TTL, and how many they are, while its lease counts
-- ARGV: op (acquire|renew|release|drop|list), replica, bytes, least, budget,
--       ttl ms, op id (may be empty), residual ms, holds, requests
--
-- A lease is live while its expiry (KEYS[2]) is ahead. Past it the replica
-- is paused, cut off or dead, and what it admitted may still run on the GPU:
-- the lease stays counted, as its residual hold, until its keep (KEYS[6])
-- passes; only then is it purged. The replica's next call revives it, and a
-- live replica's 'drop' ends it at once: that replica saw the backend's
-- figures covered by the fresh replicas' published holds, so the silent
-- one's requests are gone. A replica is fresh while its last call is within
-- half a TTL (it renews every third); 'drop' may end the lease of one past
-- its trust horizon (TTL/3 before its expiry: it admits nothing new on it),
-- which is silent too.
--
-- Every number handed back to Redis goes through fmt: Lua's own number to
-- string conversion may print large integers as 1e+15.
local leases, lexp, budgets, bexp, ops, lkeep, holds = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local op, replica = ARGV[1], ARGV[2]
local bytes, least, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local opid = ARGV[7]
local residual = math.max(ttl, tonumber(ARGV[8]) or 0)

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
purge(budgets, bexp)
-- A lease goes once its keep has passed; past its expiry alone it is a
-- residual hold. (A lease with no keep, written before keeps existed, goes
-- with its expiry.)
purge(leases, lkeep)
for _, r in ipairs(redis.call('ZRANGEBYSCORE', lexp, '-inf', now)) do
  if not redis.call('ZSCORE', lkeep, r) then redis.call('HDEL', leases, r) end
end
redis.call('ZREMRANGEBYSCORE', lexp, '-inf', now)
-- A published hold goes with its lease.
for _, r in ipairs(redis.call('HKEYS', holds)) do
  if redis.call('HEXISTS', leases, r) == 0 then redis.call('HDEL', holds, r) end
end

-- Each key expires with the last of its entries, so that an abandoned
-- budget leaves nothing behind.
local function keep(hash, zset)
  local last = redis.call('ZRANGE', zset, -1, -1, 'WITHSCORES')
  if #last == 2 then
    redis.call('PEXPIREAT', hash, last[2])
    redis.call('PEXPIREAT', zset, last[2])
  end
end

-- The leases key, its expiries and its keeps go with the last keep.
local function keepLeases()
  local last = redis.call('ZRANGE', lkeep, -1, -1, 'WITHSCORES')
  if #last == 2 then
    for _, k in ipairs({leases, lexp, lkeep, holds}) do redis.call('PEXPIREAT', k, last[2]) end
  end
end

-- residuals sums the residual holds (leases past their expiry, not yet
-- past their keep) of every replica but except.
local function residuals(except)
  local s = 0
  local all = redis.call('HGETALL', leases)
  for i = 1, #all, 2 do
    if all[i] ~= except and not redis.call('ZSCORE', lexp, all[i]) then s = s + tonumber(all[i + 1]) end
  end
  return s
end

-- published reads r's holds entry: its bytes, its TTL (the caller's if
-- it published none) and its requests.
local function published(r)
  local v = redis.call('HGET', holds, r)
  if not v then return 0, ttl, 0 end
  local b, t, n = string.match(v, '^(%d+):(%d+):(%d+)$')
  return tonumber(b) or 0, tonumber(t) or ttl, tonumber(n) or 0
end

-- fresh says whether r called within half its TTL (it renews every third);
-- stale whether it is past its trust horizon (a third of its TTL before
-- its expiry, or a residual hold), on which it admits nothing new.
local function fresh(r)
  local e = redis.call('ZSCORE', lexp, r)
  local _, t = published(r)
  return e and tonumber(e) > now + t / 2
end
local function stale(r)
  local e = redis.call('ZSCORE', lexp, r)
  local _, t = published(r)
  return not e or tonumber(e) <= now + t / 3
end

-- freshHolds sums what the fresh replicas but except published that their
-- requests may hold, and how many they are; and the leases of the others
-- but except (silent).
local function freshHolds(except)
  local s, n, q = 0, 0, 0
  local all = redis.call('HGETALL', leases)
  for i = 1, #all, 2 do
    local r = all[i]
    if r ~= except then
      if fresh(r) then
        local b, _, k = published(r)
        s, n = s + b, n + k
      else
        q = q + tonumber(all[i + 1])
      end
    end
  end
  return s, q, n
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
  -- budget, total, residual holds, then per replica: name, bytes, ttl ms,
  -- announced budget, keep ms, published holds.
  local out = {fmt(smallest(budgets)), fmt(sum(leases)), fmt(residuals(''))}
  local seen = {}
  local function add(r)
    if seen[r] then return end
    seen[r] = true
    local b = redis.call('HGET', leases, r)
    local e = redis.call('ZSCORE', lexp, r)
    local a = redis.call('HGET', budgets, r)
    local k = redis.call('ZSCORE', lkeep, r)
    local left, kept = 0, 0
    if b and e then left = tonumber(e) - now end
    if b then kept = math.max(left, k and (tonumber(k) - now) or 0) end
    table.insert(out, r)
    table.insert(out, b or '0')
    table.insert(out, fmt(left))
    table.insert(out, a or '0')
    table.insert(out, fmt(kept))
    table.insert(out, fmt(published(r)))
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
  elseif op == 'drop' then
    -- Every lease but the caller's past its holder's trust horizon goes:
    -- residual holds, and live leases within TTL/3 of their expiry.
    local all = redis.call('HGETALL', leases)
    for i = 1, #all, 2 do
      local r = all[i]
      if r ~= replica and stale(r) then
        moved = moved + tonumber(all[i + 1])
        redis.call('HDEL', leases, r)
        redis.call('ZREM', lexp, r)
        redis.call('ZREM', lkeep, r)
        redis.call('HDEL', holds, r)
      end
    end
    total = total - moved
  end
  if opid ~= '' then
    redis.call('HSET', ops, replica, opid .. ' ' .. fmt(moved))
    -- Long enough for any client retry, short enough to leave nothing.
    redis.call('PEXPIRE', ops, math.max(ttl, 60000))
  end
end

-- Every call renews the caller's lease (reviving it if it was a residual
-- hold), or removes it once empty.
local left = 0
if held > 0 then
  redis.call('HSET', leases, replica, fmt(held))
  redis.call('ZADD', lexp, fmt(now + ttl), replica)
  redis.call('ZADD', lkeep, fmt(now + residual), replica)
  redis.call('HSET', holds, replica, fmt(tonumber(ARGV[9]) or 0) .. ':' .. fmt(ttl) .. ':' .. fmt(tonumber(ARGV[10]) or 0))
  left = ttl
else
  redis.call('HDEL', leases, replica)
  redis.call('ZREM', lexp, replica)
  redis.call('ZREM', lkeep, replica)
  redis.call('HDEL', holds, replica)
end
keepLeases()

local others, quiet, running = freshHolds(replica)
return {moved, held, left, total, budget, residuals(replica), others, quiet, running}
