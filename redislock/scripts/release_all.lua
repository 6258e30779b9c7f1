-- release_all: release the locks of a set held by its tokens, in one step,
-- where nobody waits: handoff_release.lua's common case for each name,
-- with one MGET, one EXISTS and one DEL for the whole set. One server only.
--
-- KEYS     each name's lock key, then each name's {E}:live key (see
--          handoff.lua; not a string: EXISTS, not MGET, reads it)
-- ARGV[i]  the i-th name's "<token>."
--
-- Returns, per name: 1 released; 0 not held (free or another's); -1 held,
-- but waited for or watched: left as it is, for handoff_release.lua.
local n = #ARGV
local function range(cmd, from, to) -- unpack's limit: 500 keys a call
  local r = 0
  for s = from, to, 500 do
    r = r + redis.call(cmd, unpack(KEYS, s, math.min(s + 499, to)))
  end
  return r
end
local vals = {}
for s = 1, n, 500 do
  local part = redis.call('MGET', unpack(KEYS, s, math.min(s + 499, n)))
  for j = 1, #part do
    vals[s + j - 1] = part[j]
  end
end
local watched = range('EXISTS', n + 1, 2 * n) > 0
local out, gone = {}, {}
for i = 1, n do
  local cur = vals[i]
  if not cur or string.sub(cur, 1, #ARGV[i]) ~= ARGV[i] then
    out[i] = 0
  elseif watched and redis.call('EXISTS', KEYS[n + i]) == 1 then
    out[i] = -1
  else
    out[i] = 1
    gone[#gone + 1] = KEYS[i]
  end
end
for s = 1, #gone, 500 do
  redis.call('DEL', unpack(gone, s, math.min(s + 499, #gone)))
end
return out
