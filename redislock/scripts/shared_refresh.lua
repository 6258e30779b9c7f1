-- shared_refresh: extend a holder's time if, and only if, it still holds
-- (see shared.lua).
--
-- ARGV[1]  token
-- ARGV[2]  TTL in milliseconds
--
-- Returns 1 when extended, 0 when the token holds nothing here.
local z, h = KEYS[1], KEYS[2]
local now = now_ms()
prune(z, h, now)
if not redis.call('ZSCORE', z, ARGV[1]) then
  settle(z, h, now)
  return 0
end
redis.call('ZADD', z, string.format('%d', now + tonumber(ARGV[2])), ARGV[1])
settle(z, h, now)
return 1
