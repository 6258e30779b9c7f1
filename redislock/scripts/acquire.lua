-- acquire: take the lock for a token and advance the fencing counter in the
-- same atomic step, so that the lock and its fence can never disagree.
--
-- KEYS[1]  lock key      {E}:lock   (holds "<token>.<attempt>")
-- KEYS[2]  fence counter {E}:fence  (same hash slot: the {E} hash tag)
-- ARGV[1]  "<token>.<attempt>": the token and which attempt of it this is
--          (attempts of one token are numbered in increasing order)
-- ARGV[2]  TTL in milliseconds
-- ARGV[3]  "<token>."
--
-- Returns the fence (> 0) when the token holds the lock, 0 when another
-- token holds it.
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  -- A retry of this very attempt (the reply was lost and the client sent
  -- the script again): report the grant once more, with the fence it got;
  -- no other acquirer can have advanced the counter meanwhile.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
if cur then
  if string.sub(cur, 1, #ARGV[3]) ~= ARGV[3] then
    return 0 -- another token's
  end
  -- Left by another attempt of the same token. A later attempt's key stays:
  -- this one is a straggler of a try already given up.
  local theirs = tonumber(string.sub(cur, #ARGV[3] + 1))
  local ours = tonumber(string.sub(ARGV[1], #ARGV[3] + 1))
  if theirs and ours and theirs > ours then
    return 0
  end
end
-- Free, or left by an earlier attempt of the same token that failed
-- elsewhere: take it, as this attempt, with a new fence.
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
-- fence = max(previous fence + 1, server clock in microseconds).
-- The counter alone makes fences strictly increase on one server. The
-- clock keeps them increasing when the counter is lost or stale: after a
-- restart without persistence, or a failover to a replica that missed the
-- last increments, the new count starts above every fence issued before
-- (those were at most the old clock), provided the clocks did not go back
-- by more than the restart or failover took.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local f = tonumber(redis.call('GET', KEYS[2]) or '0') + 1
if f < now then
  f = now
end
-- Microseconds since 1970 stay below 2^53 until the year 2255, so the Lua
-- number is exact.
redis.call('SET', KEYS[2], string.format('%d', f))
return f
