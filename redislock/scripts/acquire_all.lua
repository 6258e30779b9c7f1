-- acquire_all: take the locks of a set for their tokens, every one or
-- none, in one step: acquire.lua's for each name (see it for the values,
-- the fence and the delayed restart). One server only: the keys of a set
-- share no slot.
--
-- KEYS     each name's lock key and fence counter, in pairs
-- ARGV[1]  TTL in milliseconds
-- ARGV[2]  restart delay in milliseconds (see acquire.lua)
-- ARGV[3]  fence counter retention in milliseconds
-- ARGV[4]  the holders' owner
-- ARGV[4+i] the i-th name's "<token>.<attempt>"
--
-- Returns the fences, in order; {0} when a name is held by anyone else,
-- or by another attempt (nothing taken: acquire.lua, name by name, sorts
-- that out); {-n} when the server may have forgotten a holder: try again
-- in n milliseconds.
local px, restart_delay, retention, owner = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local n = #KEYS / 2
-- Every key read by one MGET (in parts: unpack's limit), not a GET each:
-- a command costs a script more than the keys it names.
local vals = {}
for s = 1, #KEYS, 500 do
  local part = redis.call('MGET', unpack(KEYS, s, math.min(s + 499, #KEYS)))
  for j = 1, #part do
    vals[s + j - 1] = part[j]
  end
end
for i = 1, n do
  local cur = vals[2 * i - 1]
  if cur and attempt_of(cur) ~= ARGV[4 + i] then
    return {0}
  end
end
if restart_delay > 0 then -- see acquire.lua; only when granting
  local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)') or '')
  if up and (up - 1) * 1000 < restart_delay then
    return {-(restart_delay - (up - 1) * 1000)}
  end
end
local fences, now = {}, nil
for i = 1, n do
  local cur = vals[2 * i - 1]
  if cur then -- a retry of this very attempt: its grant stands
    redis.call('PEXPIRE', KEYS[2 * i - 1], px)
    fences[i] = tonumber(fence_of(cur) or '0')
  else
    now = now or now_us()
    local f, num = fence_after(vals[2 * i], now)
    redis.call('SET', KEYS[2 * i - 1], ARGV[4 + i] .. ':' .. f .. ':' .. owner, 'PX', px)
    redis.call('SET', KEYS[2 * i], f, 'PX', retention)
    fences[i] = num
  end
end
return fences
