-- handoff_leave (default mode): a waiter gives up. It leaves the queue,
-- and hands on (see handoff.lua) the lock if it was handed to an attempt
-- of this wait (or its try took it and the reply was lost), or if the
-- lock is free with waiters queued.
--
-- KEYS[1..5]  see handoff.lua
-- ARGV[1]     "<token>."
-- ARGV[2]     the first attempt number of the wait: later ones up to
--             ARGV[6] are its too
-- ARGV[3]     release channel
-- ARGV[4]     the waiter
-- ARGV[5]     the fence counter's retention in milliseconds
-- ARGV[6]     the last attempt number of the wait: a later one is the
--             token's next wait's, which this leave, arriving late, must
--             not free
leave_queue(KEYS[3], KEYS[4], ARGV[4])
redis.call('HDEL', KEYS[5], ARGV[4])
local cur = redis.call('GET', KEYS[1])
local mine = false
if cur then
  local held = attempt_of(cur)
  if string.sub(held, 1, #ARGV[1]) == ARGV[1] then
    local n = tonumber(string.sub(held, #ARGV[1] + 1))
    mine = n ~= nil and n >= tonumber(ARGV[2]) and n <= tonumber(ARGV[6])
  end
end
if mine or not cur then
  -- pcall'd inside: an ACL without the channel must not fail the leave.
  if hand_off(ARGV[3], ARGV[5]) == nil and mine then
    redis.call('DEL', KEYS[1])
    redis.pcall('PUBLISH', ARGV[3], '')
  end
end
return 1
