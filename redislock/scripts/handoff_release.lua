-- handoff_release (default mode): release.lua, but a lock with live
-- waiters goes straight to the first (see handoff.lua) instead of being
-- deleted, so that no try that comes later takes it first.
--
-- KEYS[1..5]  see handoff.lua
-- ARGV[1..3]  as for release.lua
-- ARGV[4]     the fence counter's retention in milliseconds
--
-- Returns as release.lua: 1 released, 2 released but the wake-up was
-- refused, 0 not held; after a hand-off, {1 or 2, the hand-off's message},
-- so that a waiter of the releasing process is told without pub/sub.
local cur = redis.call('GET', KEYS[1])
local mine
if not cur then
  mine = false
elseif ARGV[3] == '1' then
  mine = attempt_of(cur) == ARGV[1]
else
  mine = string.sub(cur, 1, #ARGV[1]) == ARGV[1]
end
if not mine then
  return 0
end
local sent, msg = hand_off(ARGV[2], ARGV[4])
if sent == nil then
  redis.call('DEL', KEYS[1])
  sent = redis.pcall('PUBLISH', ARGV[2], '')
end
local code = 1
if type(sent) == 'table' and sent.err then
  code = 2
end
if msg then
  return {code, msg}
end
return code
