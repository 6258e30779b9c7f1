-- acquire: take the lock for a token and advance the fencing counter in the
-- same atomic step, so that the lock and its fence can never disagree.
--
-- KEYS[1]  lock key      {K}:lock   (holds the token)
-- KEYS[2]  fence counter {K}:fence  (same hash slot: the {K} hash tag)
-- ARGV[1]  token
-- ARGV[2]  TTL in milliseconds
--
-- Returns the fence (> 0) when the token holds the lock, 0 when another
-- token holds it.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local f = redis.call('INCR', KEYS[2])
  if f == 1 then
    -- The counter did not exist: first use of the name, or the server lost
    -- its data (restart without persistence, eviction). Start from the
    -- server's clock in microseconds, which is greater than any value the
    -- lost counter can have reached (it counted far fewer than one
    -- acquisition per microsecond since it was itself started from the
    -- clock), so fences keep increasing across the loss.
    local t = redis.call('TIME')
    local seed = t[1] .. string.format('%06d', tonumber(t[2]))
    redis.call('SET', KEYS[2], seed)
    return tonumber(seed)
  end
  return f
end
-- A retry of this very acquisition (the reply was lost and the client sent
-- the script again): report the grant once more, with the fence it got; no
-- other acquirer can have advanced the counter while this token holds the
-- lock.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
return 0
