-- fair_acquire (fair mode): acquire (the plain script, wrapped as the
-- function acquire()) for the head of the queue only, and join the queue
-- when the lock cannot be had.
--
-- KEYS[1..2], ARGV[1..3]  as for acquire
-- KEYS[3]  {E}:queue
-- KEYS[4]  {E}:live
-- ARGV[4]  the waiter: its token
-- ARGV[5]  liveness in milliseconds
-- ARGV[6]  "try" to try only; "wait" to join the queue (or stay in it)
--          when not granted; "look" to stay in it, whose entry, once
--          answered "queued", is not made again when gone
--
-- Returns the fence (> 0) when granted; 0 when another waiter is ahead
-- (or, trying only, the lock is held); -n when the caller is at the head
-- (or is the only one) and the lock is held for n more milliseconds, or
-- a restarted server refuses it for that long (see acquire); nil when the
-- entry to look at is gone.
local queue, live, me, ttl = KEYS[3], KEYS[4], ARGV[4], tonumber(ARGV[5])
local head = live_head(queue, live, me)
local settle = 0 -- how long a restarted server still refuses (see acquire)
if head == '' or head == me then
  local f = acquire()
  if f > 0 then
    if head == me then
      leave_queue(queue, live, me)
    end
    return f
  end
  settle = -f
end
if ARGV[6] == 'try' then
  return -settle -- 0, or how long a restarted server still refuses
end
if not redis.call('ZSCORE', queue, me) then
  if ARGV[6] == 'look' then
    return false
  end
  local t = redis.call('TIME')
  redis.call('ZADD', queue, tonumber(t[1]) * 1000000 + tonumber(t[2]), me)
end
redis.call('HSET', live, me, now_ms() + ttl)
-- The queue outlives its last live waiter by a little, not forever.
redis.call('PEXPIRE', queue, 2 * ttl)
redis.call('PEXPIRE', live, 2 * ttl)
if head == '' or head == me then
  return -math.max(redis.call('PTTL', KEYS[1]), settle, 1)
end
return 0
