-- shared_break: an operator frees one grant of a semaphore or a read-write
-- lock (see shared.lua), named by its fence (Inspect reports it), as its
-- holder's release would (shared_release.lua): the other grants stay, the
-- fence counter stays, so the next grant's fence is above, the waiters are
-- woken, and the removed holder's next refresh finds its token gone.
--
-- ARGV[1]  fence (decimal)
-- ARGV[2]  release channel
--
-- Returns {the permits' limit ('' for none), the removed grant as
-- shared_inspect.lua gives each (fence, ms left, permits, writer, owner),
-- 1, or 2 when the wake-up was refused (see shared_release.lua)}, or nil
-- when no unexpired holder has that fence.
local z, h = KEYS[1], KEYS[2]
local now = now_ms()
prune(z, h, now)
local hs = redis.call('ZRANGE', z, 0, -1, 'WITHSCORES')
for i = 1, #hs, 2 do
  local tok = hs[i]
  local v = redis.call('HGET', h, tok)
  if v and string.match(v, '^%d+:(%d+)') == ARGV[1] then
    local out = {redis.call('HGET', h, '#limit') or '', ARGV[1], tonumber(hs[i + 1]) - now,
      weight(v), redis.call('HGET', h, '#w') == tok and 1 or 0, redis.call('HGET', h, '#o' .. tok) or '', 1}
    free(z, h, tok)
    settle(z, h, now)
    local sent = redis.pcall('PUBLISH', ARGV[2], '')
    if type(sent) == 'table' and sent.err then
      out[7] = 2
    end
    return out
  end
end
settle(z, h, now)
return nil
