-- inspect: read a lock's state without changing it, in one atomic step.
--
-- KEYS[1]  lock key
-- KEYS[2]  {E}:queue, KEYS[3] {E}:live (fair mode only: see queue.lua)
--
-- Returns {the lock's value ('' when free), its PTTL, the live waiters in
-- queue order...}. Dead waiters are left for the fair scripts to drop.
local cur = redis.call('GET', KEYS[1])
local out = {'', -2}
if cur then
  out = {cur, redis.call('PTTL', KEYS[1])}
end
if KEYS[2] then
  local ws = redis.call('ZRANGE', KEYS[2], 0, -1)
  if #ws > 0 then
    local now = now_ms()
    for _, w in ipairs(ws) do
      if tonumber(redis.call('HGET', KEYS[3], w) or '0') > now then
        out[#out + 1] = w
      end
    end
  end
end
return out
