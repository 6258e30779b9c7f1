-- handoff_release (default mode): release.lua, but a lock with live
-- waiters goes straight to the first (see handoff.lua) instead of being
-- deleted, so that no try that comes later takes it first. This part runs
-- first: a release with nobody waiting or watching (the common case)
-- defines, looks at and publishes nothing more;
-- handoff_queued.lua, with the hand-off's functions before it, serves the
-- others.
--
-- KEYS[1..5]  see handoff.lua
-- ARGV[1]     "<token>." to release whatever attempt of the token holds
--             it, or "<token>.<attempt>" to clean up after that failed
--             attempt only (a later attempt of the same token may hold it)
-- ARGV[2]     the fence counter's retention in milliseconds
-- The release channel is "{E}:released", from KEYS[1]: every argument
-- costs the server on every release.
--
-- Returns as release.lua: 1 released, 2 released but the wake-up was
-- refused, 0 not held; after a hand-off, {1 or 2, the hand-off's message},
-- so that a waiter of the releasing process is told without pub/sub.
local cur = redis.call('GET', KEYS[1])
-- A value of the token starts with "<token>.", one of that attempt with
-- "<token>.<attempt>:" (see value.lua, which is defined after this part:
-- a release with nobody waiting makes none of its functions).
local mine = ARGV[1]
if string.sub(mine, -1) ~= '.' then
  mine = mine .. ':'
end
if not cur or string.sub(cur, 1, #mine) ~= mine then
  return 0
end
-- {E}:live exists while a waiter is queued (handoff_acquire.lua writes
-- its entry there with its place in the queue, and both go together) or
-- a release is watched (notify.go, the watchers' marks): without it, nobody is told.
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
