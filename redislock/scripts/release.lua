-- release: delete the lock if, and only if, the token holds it, and tell
-- waiters that it is free.
--
-- KEYS[1]  lock key
-- ARGV[1]  token
-- ARGV[2]  release channel (a channel is not a key; PUBLISH reaches every
--          subscriber, on every node of a cluster)
--
-- Returns 1 when released, 0 when the key is free or another token's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
