-- break: an operator frees a lock that is not theirs, named by the fence
-- of its holder (Inspect reports it), and wakes the waiters as a release
-- does. The fence counter stays, so the next grant's fence is above; the
-- removed holder's next refresh finds its token gone.
--
-- KEYS[1]  lock key
-- ARGV[1]  fence (decimal)
-- ARGV[2]  release channel
--
-- In fair mode, KEYS[2] and KEYS[3] are the queue's (see queue.lua), and
-- next_waiter() names the waiter to wake.
--
-- Returns {the removed value, its PTTL, 1, or 2 when the wake-up was
-- refused (see release)}, or nil when the lock is free or held under
-- another fence.
local cur = redis.call('GET', KEYS[1])
if not cur or fence_of(cur) ~= ARGV[1] then
  return nil
end
local pttl = redis.call('PTTL', KEYS[1])
local nxt = next_waiter()
redis.call('DEL', KEYS[1])
local sent = redis.pcall('PUBLISH', ARGV[2], nxt)
if type(sent) == 'table' and sent.err then
  return {cur, pttl, 2}
end
return {cur, pttl, 1}
