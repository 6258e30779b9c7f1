-- shared: a semaphore's permits, or a read-write lock's readers and writer,
-- as one object of a name, apart from its lock (backend.Modal). The shared
-- scripts are this file followed by their own.
--
-- KEYS[1]  {E}:sem or {E}:rw       sorted set: holder token -> until when
--                                  it holds (server time, ms)
-- KEYS[2]  {E}:sem.h or {E}:rw.h   hash: holder token -> "<attempt>:<fence>",
--                                  or "<attempt>:<fence>:<permits>" for a
--                                  holder of more than one; '#o<token>'
--                                  the holder's owner (Claim.Owner), unless
--                                  empty; '#limit' the permits' limit; '#x'
--                                  the permits held beyond one per holder;
--                                  '#w' the writer's token
-- KEYS[3]  {E}:sem.fence or {E}:rw.fence   the object's fence counter
--
-- {E}:sem.limit, a semaphore's resize record (shared_resize.lua), is the
-- limit while it stands: an operator's, without expiry.
--
-- Tokens are 32 hex digits, so they never clash with the '#' fields.
-- The owner has a field of its own, not a part of the grant's value: a
-- client of an earlier version reads the value as it wrote it (a weight
-- misread would leave '#x' counting permits no one holds), and leaves
-- the owner of a holder it frees to go with the hash.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- hdel removes fields in chunks (unpack is bounded by Lua's stack).
local function hdel(h, fs)
  for i = 1, #fs, 500 do
    redis.call('HDEL', h, unpack(fs, i, math.min(i + 499, #fs)))
  end
end

-- weight is the permits a holder's field's value v takes.
local function weight(v)
  return tonumber(string.match(v or '', '^%d+:%d+:(%d+)$') or '1')
end

-- unweigh takes the permits that toks hold beyond one each off '#x',
-- before their fields go.
local function unweigh(h, toks)
  local x = 0
  for i = 1, #toks, 500 do
    for _, v in ipairs(redis.call('HMGET', h, unpack(toks, i, math.min(i + 499, #toks)))) do
      if v then
        x = x + weight(v) - 1
      end
    end
  end
  if x > 0 then
    redis.call('HINCRBY', h, '#x', -x)
  end
end

-- free takes holder tok's grant away: its permits, its owner, and the
-- writer's field with the writer.
local function free(z, h, tok)
  redis.call('ZREM', z, tok)
  unweigh(h, {tok})
  redis.call('HDEL', h, tok, '#o' .. tok)
  if redis.call('HGET', h, '#w') == tok then
    redis.call('HDEL', h, '#w')
  end
end

-- prune drops the holders whose time ran out, and the writer's field with
-- its holder.
local function prune(z, h, now)
  local dead = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
    unweigh(h, dead)
    local fs = {}
    for i, tok in ipairs(dead) do
      fs[2 * i - 1], fs[2 * i] = tok, '#o' .. tok
    end
    hdel(h, fs)
    local w = redis.call('HGET', h, '#w')
    if w and not redis.call('ZSCORE', z, w) then
      redis.call('HDEL', h, '#w')
    end
  end
end

-- settle makes the object's keys expire with its last holder, and deletes
-- them when nothing is left: no residue.
local function settle(z, h, now)
  local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')[2]
  local m = tonumber(last or '0')
  if m <= now then
    redis.call('DEL', z, h)
    return
  end
  redis.call('PEXPIRE', z, m - now)
  redis.call('PEXPIRE', h, m - now)
end
