-- handoff (default mode): the waiters' queue of a contended lock, and the
-- hand-off of a freed lock straight to the longest-waiting live waiter,
-- shared by the default mode's scripts, which are value.lua, fence.lua,
-- queue.lua and this file followed by their own.
--
-- KEYS[1]  {E}:lock, KEYS[2] {E}:fence  (see acquire.lua)
-- KEYS[3]  {E}:queue, KEYS[4] {E}:live  (see queue.lua: the fair queue's
--          layout, so that Inspect reads both alike)
-- KEYS[5]  {E}:hand   hash: waiter -> "<token>.<attempt>|<px>", the lock
--          value and TTL it takes when handed the lock
--
-- A waiter is in the queue only while the lock is held: an uncontended
-- acquisition never touches these keys. A waiter renews its entry on
-- every try (at least every livenessTTL/3) with the attempt of that try.

-- hand_off gives the lock, free or about to be freed by the caller, to the
-- longest-waiting live waiter: its value, a new fence and its TTL, as if
-- its last try had taken it. It publishes "!<attempt>:<fence>:<waiter>"
-- and returns PUBLISH's answer (pcall's) and that message, or nil when no
-- live waiter is queued. The waiter knows it holds the lock from the message, without a
-- round trip; it trusts a message only for the attempt of its latest try
-- that the server answered "queued", which was sent before this ran.
local function hand_off(channel, retention)
  while true do
    local w = live_head(KEYS[3], KEYS[4], '')
    if w == '' then
      return nil
    end
    local h = redis.call('HGET', KEYS[5], w)
    leave_queue(KEYS[3], KEYS[4], w)
    redis.call('HDEL', KEYS[5], w)
    local value, px = string.match(h or '', '^(.*)|(%d+)$')
    if value then
      local fence = next_fence(KEYS[2], retention)
      local owner = string.match(w, '^[^:]*:(.*)$') or ''
      redis.call('SET', KEYS[1], value .. ':' .. fence .. ':' .. owner, 'PX', px)
      local msg = '!' .. string.match(value, '%.(%d+)$') .. ':' .. fence .. ':' .. w
      return redis.pcall('PUBLISH', channel, msg), msg
    end
  end
end
