-- shared_acquire: grant a permit, a read or a write (see shared.lua) and
-- advance the object's fence counter in one atomic step.
--
-- ARGV[1]  'p' permit, 'r' read, 'w' write
-- ARGV[2]  token
-- ARGV[3]  attempt number (see attempt in scripts.go)
-- ARGV[4]  TTL in milliseconds
-- ARGV[5]  limit (permits)
-- ARGV[6]  restart delay in milliseconds (see acquire.lua)
-- ARGV[7]  fence counter retention in milliseconds
-- ARGV[12] the permits a permit takes (after shared_queue.lua's)
-- ARGV[13] the holder's owner (Claim.Owner)
-- KEYS[6]  a permit's only: {E}:sem.limit, the semaphore's resize record
--
-- The prefix, shared_queue.lua, defines the queue's part:
-- queued(now) -> the live waiters ahead of the caller and whether a writer
-- is among them, refused(now, us) -> the answer when not granted, and
-- granted().
--
-- Returns the fence (> 0) when granted; 0 when not; -n when a restarted
-- server refuses for n more milliseconds (see acquire.lua), or (a
-- waiter) to look again in n milliseconds; the string "limit:<n>" when the
-- held permits carry the limit n and ARGV[5] differs; "resized:<n>" when
-- the resize record n is below the permits asked; nil when a waiter's
-- entry to look at is gone (see shared_queue.lua).
local z, h, fk = KEYS[1], KEYS[2], KEYS[3]
local mode, tok, att, px, limit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
-- One clock reading serves the expiries (ms) and the fence (µs).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local us = t[1] .. string.format('%06d', tonumber(t[2]))
prune(z, h, now)
local mine = redis.call('HGET', h, tok)
if mine then
  local a, f = string.match(mine, '^(%d+):(%d+)')
  if tonumber(a) == att then
    -- A retry of this very attempt (its reply was lost): the same grant.
    redis.call('ZADD', z, string.format('%d', now + px), tok)
    settle(z, h, now)
    return tonumber(f)
  end
  if tonumber(a) > att then
    settle(z, h, now)
    return 0 -- a straggler of a try already given up (no waiter)
  end
  -- An earlier attempt of this token holds: this one takes its place.
end
local held = redis.call('ZCARD', z)
local permits = tonumber(ARGV[12])
local ahead, writer_ahead = queued(now)
if mode == 'p' then
  -- A resize record (shared_resize.lua) is the limit, whatever the claim's.
  local r = tonumber(redis.call('GET', KEYS[6]) or '')
  if r then
    if permits > r then
      settle(z, h, now)
      return 'resized:' .. r
    end
    limit = r
  elseif held > 0 then
    local l = tonumber(redis.call('HGET', h, '#limit') or '0')
    if l ~= limit then
      settle(z, h, now)
      return 'limit:' .. l
    end
  end
  local x = tonumber(redis.call('HGET', h, '#x') or '0')
  if not mine and held + x + ahead + permits > limit then
    return refused(now, us)
  end
elseif mode == 'r' then
  if redis.call('HEXISTS', h, '#w') == 1 or writer_ahead then
    return refused(now, us)
  end
else
  -- A waiting writer's place in the queue makes the readers behind it
  -- stand back.
  if held > (mine and 1 or 0) or ahead > 0 then
    return refused(now, us)
  end
end
-- The delayed restart (see acquire.lua), only when granting.
local restart_delay = tonumber(ARGV[6])
if restart_delay > 0 then
  local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)') or '')
  if up and (up - 1) * 1000 < restart_delay then
    settle(z, h, now)
    return -(restart_delay - (up - 1) * 1000)
  end
end
if mode == 'p' then
  redis.call('HSET', h, '#limit', limit)
elseif mode == 'w' then
  redis.call('HSET', h, '#w', tok)
end
granted()
-- The fence as the lock's (see fence.lua).
local fence = next_fence(fk, ARGV[7], nil)
if mine then
  unweigh(h, {tok})
end
local v = att .. ':' .. fence
if mode == 'p' and permits > 1 then
  v = v .. ':' .. permits
  redis.call('HINCRBY', h, '#x', permits - 1)
end
if ARGV[13] ~= '' then
  redis.call('HSET', h, tok, v, '#o' .. tok, ARGV[13])
else
  redis.call('HSET', h, tok, v)
end
redis.call('ZADD', z, string.format('%d', now + px), tok)
settle(z, h, now)
return tonumber(fence)
