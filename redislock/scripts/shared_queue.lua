-- shared_queue (both modes): the waiters' queue of a semaphore or a
-- read-write lock, for shared_acquire, served in arrival order: a claim
-- of n permits is granted while the permits held, those of the live
-- waiters ahead and n are at most the limit, a reader when no writer
-- holds or waits ahead, a writer when nothing is held and no one waits
-- ahead.
--
-- KEYS[4]  {E}:sem.q or {E}:rw.q        sorted set: waiter -> when it
--                                       joined (server time, µs)
-- KEYS[5]  {E}:sem.live or {E}:rw.live  hash: waiter -> until when it is
--                                       alive (server time, ms)
-- ARGV[8]  the waiter ('' for a try without waiting); a writer's starts
--          with 'w'; a permit's with 'p', then, for more than one, the
--          permits and '.'
-- ARGV[9]  liveness in milliseconds
-- ARGV[10] 'try', 'wait' or 'look', as for fair_acquire.lua
-- ARGV[11] release channel
--
-- A waiter renews its liveness on every try; dead ones are dropped when a
-- try passes them.
local q, live, me = KEYS[4], KEYS[5], ARGV[8]

-- queued counts the live waiters ahead of me (all of them for a try
-- without waiting), by their permits, dropping dead ones.
local function queued(now)
  local n, w = 0, false
  for _, x in ipairs(redis.call('ZRANGE', q, 0, -1)) do
    if x == me then
      break
    end
    if tonumber(redis.call('HGET', live, x) or '0') > now then
      n = n + tonumber(string.match(x, '^p(%d+)%.') or '1')
      if string.sub(x, 1, 1) == 'w' then
        w = true
      end
    else
      redis.call('ZREM', q, x)
      redis.call('HDEL', live, x)
    end
  end
  return n, w
end

-- refused joins the queue (or renews the caller's place) and answers when
-- to look again: when the first holder's time runs out, if one holds.
local function refused(now, us)
  settle(KEYS[1], KEYS[2], now)
  if me == '' or ARGV[10] == 'try' then
    return 0
  end
  if not redis.call('ZSCORE', q, me) then
    if ARGV[10] == 'look' then
      return false
    end
    redis.call('ZADD', q, us, me)
  end
  local ttl = tonumber(ARGV[9])
  redis.call('HSET', live, me, string.format('%d', now + ttl))
  redis.call('PEXPIRE', q, 2 * ttl)
  redis.call('PEXPIRE', live, 2 * ttl)
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
  if not first then
    return 0
  end
  return -math.max(tonumber(first) - now, 1)
end

-- granted takes the caller out of the queue; those behind may be able to
-- enter too (more permits free, readers behind a reader): wake them.
local function granted()
  if me == '' then
    return
  end
  redis.call('ZREM', q, me)
  redis.call('HDEL', live, me)
  if redis.call('ZCARD', q) > 0 then
    redis.pcall('PUBLISH', ARGV[11], '')
  end
end
