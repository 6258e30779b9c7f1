-- release_all: release the locks of a set held by its tokens, in one step,
-- where nobody waits: handoff_release.lua's common case for each name,
-- with one MGET and one DEL for the whole set. One server only.
--
-- KEYS     each name's lock key and {E}:live key (see handoff.lua), in pairs
-- ARGV[i]  the i-th name's "<token>."
--
-- Returns, per name: 1 released; 0 not held (free or another's); -1 held,
-- but waited for or watched: left as it is, for handoff_release.lua.
local vals = {}
for s = 1, #KEYS, 500 do
  local part = redis.call('MGET', unpack(KEYS, s, math.min(s + 499, #KEYS)))
  for j = 1, #part do
    vals[s + j - 1] = part[j]
  end
end
local out, gone = {}, {}
for i = 1, #KEYS / 2 do
  local cur = vals[2 * i - 1]
  if not cur or string.sub(cur, 1, #ARGV[i]) ~= ARGV[i] then
    out[i] = 0
  elseif vals[2 * i] then
    out[i] = -1
  else
    out[i] = 1
    gone[#gone + 1] = KEYS[2 * i - 1]
  end
end
for s = 1, #gone, 500 do
  redis.call('DEL', unpack(gone, s, math.min(s + 499, #gone)))
end
return out
