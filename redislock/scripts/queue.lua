-- queue (fair mode): the waiters' queue of one lock, shared by the fair
-- scripts, which are this file followed by their own.
--
-- {E}:queue  sorted set: waiter token -> when it joined (server time, µs)
-- {E}:live   hash: waiter token -> until when it is alive (server time, ms)
--
-- A waiter renews its liveness on every try. One that stopped trying (its
-- process died, or lost the server) is dropped when it reaches the head,
-- so a dead waiter never blocks the queue for longer than its liveness.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- live_head returns the longest-waiting live waiter ('' for none), dropping
-- dead ones ahead of it. me is alive whatever its entry says: it is the
-- caller. An empty queue costs one lookup: the clock is read only when
-- there is an entry to judge.
local function live_head(queue, live, me)
  local now
  while true do
    local h = redis.call('ZRANGE', queue, 0, 0)[1]
    if not h then
      return ''
    end
    if h == me then
      return h
    end
    now = now or now_ms()
    if tonumber(redis.call('HGET', live, h) or '0') > now then
      return h
    end
    redis.call('ZREM', queue, h)
    redis.call('HDEL', live, h)
  end
end

-- leave_queue removes a waiter.
local function leave_queue(queue, live, me)
  redis.call('ZREM', queue, me)
  redis.call('HDEL', live, me)
end
