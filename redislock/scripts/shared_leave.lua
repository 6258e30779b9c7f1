-- shared_leave: a waiter gives up. It leaves the queue (see
-- shared_queue.lua), frees what its attempt was granted after all (a reply
-- lost), and wakes the others, who may enter now.
--
-- ARGV[1]  token
-- ARGV[2]  attempt number
-- ARGV[3]  the waiter
-- ARGV[4]  release channel
local z, h, q, live, tok = KEYS[1], KEYS[2], KEYS[4], KEYS[5], ARGV[1]
local now = now_ms()
prune(z, h, now)
redis.call('ZREM', q, ARGV[3])
redis.call('HDEL', live, ARGV[3])
local cur = redis.call('HGET', h, tok)
if cur and string.match(cur, '^(%d+):') == ARGV[2] then
  free(z, h, tok)
end
settle(z, h, now)
redis.pcall('PUBLISH', ARGV[4], '')
return 1
