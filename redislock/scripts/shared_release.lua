-- shared_release: free a holder's permit, read or write, and wake the
-- key's waiters (see shared.lua and release.lua).
--
-- ARGV[1]  token
-- ARGV[2]  release channel
-- ARGV[3]  '' to release whatever attempt of the token holds; an attempt
--          number to clean up after that failed attempt only
--
-- Returns 1 when released, 2 when released but the wake-up was refused,
-- 0 when the token held nothing.
local z, h, tok = KEYS[1], KEYS[2], ARGV[1]
local now = now_ms()
prune(z, h, now)
local cur = redis.call('HGET', h, tok)
local mine = cur ~= false and cur ~= nil
if mine and ARGV[3] ~= '' then
  mine = string.match(cur, '^(%d+):') == ARGV[3]
end
if not mine then
  settle(z, h, now)
  return 0
end
free(z, h, tok)
settle(z, h, now)
local sent = redis.pcall('PUBLISH', ARGV[2], '')
if type(sent) == 'table' and sent.err then
  return 2
end
return 1
