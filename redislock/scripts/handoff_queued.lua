-- handoff_queued (default mode): the rest of handoff_release.lua, for a
-- lock with waiters or watchers (its {E}:live exists).
local channel = string.sub(KEYS[1], 1, -5) .. 'released' -- "{E}:lock"
local sent, msg = hand_off(channel, ARGV[2])
if sent == nil then
  redis.call('DEL', KEYS[1])
  sent = redis.pcall('PUBLISH', channel, '')
end
local code = 1
if type(sent) == 'table' and sent.err then
  code = 2
end
if msg then
  return {code, msg}
end
return code
