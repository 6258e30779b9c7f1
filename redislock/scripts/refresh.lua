-- refresh: extend the lock if, and only if, the token holds it.
--
-- KEYS[1]  lock key
-- ARGV[1]  "<token>."  (the lock holds "<token>.<attempt>")
-- ARGV[2]  TTL in milliseconds
--
-- Returns 1 when extended, 0 when the key is free or another token's.
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, #ARGV[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
