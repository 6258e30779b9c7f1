-- shared_resize: an operator sets a semaphore's limit (see shared.lua),
-- or removes it: the record that every permit's acquisition reads
-- (shared_acquire.lua) and Inspect reports, kept without expiry.
--
-- KEYS[1]  {E}:sem.h       the holders' hash, as in shared.lua
-- KEYS[2]  {E}:sem.limit   the record: the limit, in decimal
-- ARGV[1]  the limit, 1 to MaxLimit; '0' removes the record
-- ARGV[2]  release channel
--
-- Returns 1, or 2 when the wake-up was refused (see shared_release.lua).
if ARGV[1] == '0' then
  redis.call('DEL', KEYS[2])
  return 1
end
redis.call('SET', KEYS[2], ARGV[1])
-- The holders are judged under it now (their hash goes with the last of
-- them, see settle in shared.lua).
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], '#limit', ARGV[1])
end
-- A raised limit may let waiters in: wake them as a release does.
local sent = redis.pcall('PUBLISH', ARGV[2], '')
if type(sent) == 'table' and sent.err then
  return 2
end
return 1
