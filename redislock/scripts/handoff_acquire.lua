-- handoff_acquire (default mode): a waiter's try. acquire (the plain
-- script, wrapped as the function acquire()) takes a free lock, or one
-- handed to an earlier attempt of the same token (with a new fence); when
-- another token holds it, the waiter joins the queue (or renews its entry)
-- with this try's attempt, which a release hands the lock to.
--
-- KEYS[1..5]  see handoff.lua
-- ARGV[1..3]  as for acquire
-- ARGV[4]     the waiter
-- ARGV[5]     liveness in milliseconds
-- ARGV[6]     'wait', or 'look' once a try of the wait was answered
--             "queued": an entry gone since (skipped as dead) is not made
--             again
--
-- Returns the fence (> 0) when granted; 0 when queued; -n when a restarted
-- server refuses the name for n more milliseconds (not queued); nil when
-- the entry is gone. A waiter renews at least every TTL/4, so that a
-- holder's TTL running out costs the waiters little without a look at
-- the holder's PTTL here.
local f = acquire()
if f ~= 0 then
  if f > 0 then
    leave_queue(KEYS[3], KEYS[4], ARGV[4])
    redis.call('HDEL', KEYS[5], ARGV[4])
  end
  return f
end
-- A later attempt of this token holds the lock: this try is a straggler
-- (its answer was lost, the wait went on). Queued, it would be handed the
-- lock at that holder's release, and hold it, for nobody, for its TTL.
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, #ARGV[3]) == ARGV[3] then
  return 0
end
local me, ttl = ARGV[4], tonumber(ARGV[5])
local t = redis.call('TIME')
if not redis.call('ZSCORE', KEYS[3], me) then
  if ARGV[6] == 'look' then
    redis.call('HDEL', KEYS[5], me)
    return false
  end
  redis.call('ZADD', KEYS[3], tonumber(t[1]) * 1000000 + tonumber(t[2]), me)
end
redis.call('HSET', KEYS[4], me, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + ttl)
redis.call('HSET', KEYS[5], me, ARGV[1] .. '|' .. ARGV[2])
-- The queue outlives its last live waiter by a little, not forever.
for i = 3, 5 do
  redis.call('PEXPIRE', KEYS[i], 2 * ttl)
end
return 0
