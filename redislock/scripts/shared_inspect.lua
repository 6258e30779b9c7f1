-- shared_inspect: read a semaphore's or a read-write lock's holders (see
-- shared.lua) and live waiters without changing them, in one atomic step.
--
-- KEYS[1], KEYS[2]  the holders' sorted set and hash, as in shared.lua
-- KEYS[3]  the fence counter, unused (the keys are the acquire script's)
-- KEYS[4], KEYS[5]  the queue, as in shared_queue.lua
-- KEYS[6]  a semaphore's only: its resize record (shared_resize.lua)
--
-- Returns {the permits' limit: the record's, a number, when one stands,
-- else the holders' ('' for none), n, then for each of the n
-- unexpired holders its fence (a string), ms left, permits, 1 for the
-- writer (else 0) and owner ('' for none), then the live waiters in queue order} (see
-- waiters.lua). Expired holders are left for the next grant or release to
-- prune.
local z, h = KEYS[1], KEYS[2]
local now = now_ms()
local hs = redis.call('ZRANGEBYSCORE', z, '(' .. now, '+inf', 'WITHSCORES')
local writer = redis.call('HGET', h, '#w')
local out = {redis.call('HGET', h, '#limit') or '', 0}
if KEYS[6] then
  out[1] = tonumber(redis.call('GET', KEYS[6])) or out[1]
end
for i = 1, #hs, 2 do
  local v = redis.call('HGET', h, hs[i])
  if v then
    out[#out + 1] = string.match(v, '^%d+:(%d+)')
    out[#out + 1] = tonumber(hs[i + 1]) - now
    out[#out + 1] = weight(v)
    out[#out + 1] = hs[i] == writer and 1 or 0
    out[#out + 1] = redis.call('HGET', h, '#o' .. hs[i]) or ''
    out[2] = out[2] + 1
  end
end
return live_waiters(KEYS[4], KEYS[5], out)
