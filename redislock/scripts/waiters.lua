-- waiters: the inspect scripts' view of a queue (queue.lua's or
-- shared_queue.lua's), after a script that defines now_ms.

-- live_waiters appends queue's live waiters to out, in queue order, and
-- returns out. Dead ones are left for the acquire scripts to drop. An
-- empty queue costs one lookup: no clock reading.
local function live_waiters(queue, live, out)
  local ws = redis.call('ZRANGE', queue, 0, -1)
  if #ws > 0 then
    local now = now_ms()
    for _, w in ipairs(ws) do
      if tonumber(redis.call('HGET', live, w) or '0') > now then
        out[#out + 1] = w
      end
    end
  end
  return out
end
