-- inspect: read a lock's state without changing it, in one atomic step.
--
-- KEYS[1]  lock key
-- KEYS[2]  {E}:queue, KEYS[3] {E}:live (fair mode only: see queue.lua)
--
-- Returns {the lock's value ('' when free), its PTTL, the live waiters in
-- queue order...} (see waiters.lua).
local cur = redis.call('GET', KEYS[1])
local out = {'', -2}
if cur then
  out = {cur, redis.call('PTTL', KEYS[1])}
end
if KEYS[2] then
  live_waiters(KEYS[2], KEYS[3], out)
end
return out
