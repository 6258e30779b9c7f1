-- leave (fair mode): a waiter gives up. It leaves the queue, deletes the
-- lock if its attempt took it after all (a reply lost), and, if that
-- leaves the lock free, wakes the next waiter.
--
-- KEYS[1]  lock key
-- KEYS[2]  {E}:queue
-- KEYS[3]  {E}:live
-- ARGV[1]  "<token>.<attempt>"
-- ARGV[2]  release channel
-- ARGV[3]  the waiter: its token
leave_queue(KEYS[2], KEYS[3], ARGV[3])
local cur = redis.call('GET', KEYS[1])
if cur and attempt_of(cur) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  cur = false
end
if not cur then
  local h = live_head(KEYS[2], KEYS[3], '')
  if h ~= '' then
    -- pcall: an ACL without the channel must not fail the leave (see
    -- release.lua); the next waiter polls.
    redis.pcall('PUBLISH', ARGV[2], h)
  end
end
return 1
