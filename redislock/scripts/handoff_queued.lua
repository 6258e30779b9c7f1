-- handoff_queued (default mode): the rest of handoff_release.lua, for a
-- lock with waiters or watchers (its {E}:live exists).
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
