-- raise (quorum mode): while this attempt still holds the lock on this
-- server, raise the fencing counter to at least the fence the acquisition
-- reports, the highest that any granting server returned, and record that
-- fence in the lock's value, where Inspect and Break read it. See the
-- Quorum type's comment for why this keeps fences strictly increasing
-- across holders.
--
-- KEYS[1]  lock key
-- KEYS[2]  fence counter
-- ARGV[1]  "<token>.<attempt>"
-- ARGV[2]  fence (decimal)
-- ARGV[3]  retention in milliseconds (see acquire)
-- ARGV[4]  what is left of the lock's expiry, in milliseconds, counted
--          from before the acquisition was sent: at most what the server
--          has left (no PTTL, so that locking needs no +pttl)
--
-- Returns 1 when the attempt holds the lock (counter now >= fence), else 0.
local cur = redis.call('GET', KEYS[1])
if not cur or attempt_of(cur) ~= ARGV[1] then
  return 0
end
local c = tonumber(redis.call('GET', KEYS[2]) or '0')
if c == nil or c < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
-- Not KEEPTTL: Redis 5 has none.
local owner = string.match(cur, '^[^:]*:[^:]*:(.*)$') or ''
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2] .. ':' .. owner, 'PX', ARGV[4])
return 1
