-- release: delete the lock if, and only if, the token holds it, and tell
-- waiters that it is free. The message names the waiter to serve next
-- (fair mode), or is empty: every waiter may try. next_waiter() is defined
-- by what the driver puts before this script.
--
-- KEYS[1]  lock key
-- ARGV[1]  "<token>." to release whatever attempt of the token holds it
--          (the lock holds "<token>.<attempt>:<fence>:<owner>"),
--          or "<token>.<attempt>" with ARGV[3] = "1" to clean up after one
--          failed attempt only (a later attempt of the same token may hold
--          it by now)
-- ARGV[2]  release channel (a channel is not a key; PUBLISH reaches every
--          subscriber, on every node of a cluster)
--
-- In fair mode, KEYS[2] and KEYS[3] are the queue's (see queue.lua).
--
-- Returns 1 when released, 2 when released but the wake-up was refused
-- (an ACL without the channel: Redis 7's default is resetchannels), 0 when
-- the key is free or another's. A refused wake-up must not undo or hide a
-- release that happened: waiters also poll.
local cur = redis.call('GET', KEYS[1])
local mine
if not cur then
  mine = false
elseif ARGV[3] == '1' then
  mine = attempt_of(cur) == ARGV[1]
else
  mine = cur and string.sub(cur, 1, #ARGV[1]) == ARGV[1]
end
if mine then
  -- The next waiter first: an error there (an ACL without a queue
  -- command) must fail the release before the key is deleted, not after.
  local nxt = next_waiter()
  redis.call('DEL', KEYS[1])
  local sent = redis.pcall('PUBLISH', ARGV[2], nxt)
  if type(sent) == 'table' and sent.err then
    return 2
  end
  return 1
end
return 0
